"""The few Machines API calls the proxy makes: it writes nothing itself, it asks a broker."""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from souk.models.api import PublicMachine

WAIT_MAX = 60.0  # the broker's own bound on one wait


class BrokerError(Exception):
    """A refused or failed broker call; `status` is the HTTP status (0: unreachable)."""

    def __init__(self, status: int, code: str, message: str) -> None:
        super().__init__(f"{status} {code}: {message}")
        self.status = status
        self.code = code


class BrokerClient:
    """Bearer-token client of one broker, over its own pooled session."""

    def __init__(self, base_url: str, token: str, timeout: float = 30.0) -> None:
        self.base_url = base_url.rstrip("/")
        self.token = token
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    def _http(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self.token}"},
                connector=aiohttp.TCPConnector(limit=64),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()

    async def _call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        timeout: float | None = None,
        ok: tuple[int, ...] = (200,),
    ) -> tuple[int, Any]:
        url = self.base_url + path
        try:
            async with self._http().request(
                method,
                url,
                json=body,
                params=params,
                timeout=aiohttp.ClientTimeout(total=timeout or self.timeout),
            ) as resp:
                text = await resp.text()
                data: Any = None
                if text:
                    try:
                        data = await resp.json(content_type=None)
                    except ValueError:
                        data = {"error": text[:200]}
                if resp.status not in ok:
                    err = data if isinstance(data, dict) else {}
                    raise BrokerError(
                        resp.status,
                        str(err.get("status") or err.get("code") or "error"),
                        str(err.get("error") or text[:200]),
                    )
                return resp.status, data
        except (aiohttp.ClientError, TimeoutError) as exc:
            raise BrokerError(0, "broker_unreachable", f"{method} {url}: {exc!r}") from exc

    async def app_exists(self, app: str) -> bool:
        status, _ = await self._call("GET", f"/v1/apps/{app}", ok=(200, 404))
        return status == 200

    async def machine(self, app: str, machine_id: str) -> PublicMachine:
        _, data = await self._call("GET", f"/v1/apps/{app}/machines/{machine_id}")
        return PublicMachine.model_validate(data)

    async def machines(self, app: str) -> list[PublicMachine]:
        _, data = await self._call("GET", f"/v1/apps/{app}/machines")
        return [PublicMachine.model_validate(m) for m in data or []]

    async def start(self, app: str, machine_id: str) -> None:
        await self._call("POST", f"/v1/apps/{app}/machines/{machine_id}/start")

    async def stop(self, app: str, machine_id: str) -> None:
        await self._call("POST", f"/v1/apps/{app}/machines/{machine_id}/stop", body={})

    async def wait(self, app: str, machine_id: str, state: str, timeout: float) -> bool:
        """Whether the machine reached `state` within `timeout` (long-polled, in slices the
        broker accepts)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return False
            piece = min(left, WAIT_MAX)
            status, _ = await self._call(
                "GET",
                f"/v1/apps/{app}/machines/{machine_id}/wait",
                params={"state": state, "timeout": f"{piece:.3f}"},
                timeout=piece + 5,
                ok=(200, 408),
            )
            if status == 200:
                return True
