"""Talking to workers over their internal HTTP API: one pooled client for the whole broker.

Worker errors come back as `WorkerError` carrying the worker's own status and body, so the
broker can pass a 404 or a 409 through and turn a 412 into a placement refusal.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

import aiohttp
from pydantic import BaseModel

from souk.models.api import NONCE_HEADER
from souk.models.capacity import Offer, OfferRequest
from souk.models.machine import CreateMachine, Machine, MachineEvent, WaitResult

DEFAULT_TIMEOUT = 10.0


class WorkerError(Exception):
    """A worker answered with an error, or could not be reached (`http_status` 0 then)."""

    def __init__(
        self,
        worker: str,
        http_status: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(f"worker {worker}: {message}")
        self.worker = worker
        self.http_status = http_status
        self.reason = reason
        self.message = message
        self.details = details or {}


class WorkerClient:
    """Typed calls to any worker, given its base URL. Safe to share across tasks."""

    def __init__(self, session: aiohttp.ClientSession | None = None) -> None:
        self._session = session
        self._own = session is None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            connector = aiohttp.TCPConnector(limit=0, limit_per_host=64, ttl_dns_cache=300)
            self._session = aiohttp.ClientSession(connector=connector)
        return self._session

    async def close(self) -> None:
        if self._own and self._session is not None:
            await self._session.close()

    async def request(
        self,
        worker: str,
        base: str,
        method: str,
        path: str,
        body: BaseModel | None = None,
        params: dict[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        nonce: str | None = None,
    ) -> Any:
        data = body.model_dump_json(exclude_none=True).encode() if body is not None else None
        headers = {"Content-Type": "application/json"} if data is not None else {}
        if nonce:
            headers[NONCE_HEADER] = nonce
        try:
            async with self.session.request(
                method,
                base + path,
                data=data,
                headers=headers,
                params=params,
                timeout=aiohttp.ClientTimeout(total=max(timeout, 0.001)),
            ) as resp:
                raw = await resp.read()
                status = resp.status
        except (TimeoutError, asyncio.TimeoutError) as exc:  # noqa: UP041
            raise WorkerError(worker, 0, "timeout", f"no answer within {timeout:.3g}s") from exc
        except aiohttp.ClientError as exc:
            raise WorkerError(worker, 0, "unreachable", f"unreachable: {exc}") from exc
        try:
            payload = json.loads(raw) if raw else None
        except ValueError:
            payload = None
        if status >= 400 and status != 408:
            body_ = payload if isinstance(payload, dict) else {}
            raise WorkerError(
                worker,
                status,
                str(body_.get("status") or body_.get("code") or "error"),
                str(body_.get("error") or raw[:200].decode(errors="replace")),
                body_.get("details") if isinstance(body_.get("details"), dict) else None,
            )
        return payload if status != 408 else {"__timeout__": payload}

    async def offer(self, worker: str, base: str, req: OfferRequest, timeout: float) -> Offer:
        return Offer.model_validate(
            await self.request(worker, base, "POST", "/v1/offers", req, timeout=timeout)
        )

    async def create(self, worker: str, base: str, req: CreateMachine, timeout: float) -> Machine:
        return Machine.model_validate(
            await self.request(worker, base, "POST", "/v1/machines", req, timeout=timeout)
        )

    async def machine(self, worker: str, base: str, machine_id: str) -> Machine:
        return Machine.model_validate(
            await self.request(worker, base, "GET", f"/v1/machines/{machine_id}")
        )

    async def machines(
        self, worker: str, base: str, app: str, include_deleted: bool = False
    ) -> list[Machine]:
        params = {"app": app}
        if include_deleted:
            params["include_deleted"] = "true"
        data = await self.request(worker, base, "GET", "/v1/machines", params=params)
        return [Machine.model_validate(item) for item in data]

    async def action(
        self,
        worker: str,
        base: str,
        method: str,
        path: str,
        body: BaseModel | None = None,
        params: dict[str, str] | None = None,
        nonce: str | None = None,
    ) -> Machine:
        return Machine.model_validate(
            await self.request(worker, base, method, path, body, params=params, nonce=nonce)
        )

    async def wait(
        self, worker: str, base: str, machine_id: str, params: dict[str, str], timeout: float
    ) -> tuple[bool, WaitResult]:
        data = await self.request(
            worker,
            base,
            "GET",
            f"/v1/machines/{machine_id}/wait",
            params=params,
            timeout=timeout + 5.0,
        )
        if isinstance(data, dict) and "__timeout__" in data:
            return False, WaitResult.model_validate(data["__timeout__"])
        return True, WaitResult.model_validate(data)

    async def events(self, worker: str, base: str, machine_id: str) -> list[MachineEvent]:
        data = await self.request(worker, base, "GET", f"/v1/machines/{machine_id}/events")
        return [MachineEvent.model_validate(item) for item in data]
