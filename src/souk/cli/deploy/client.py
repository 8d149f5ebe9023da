"""An asynchronous client of the broker's public Machines API, for the deploy commands: batches
run in parallel and leases are refreshed in the background while a deploy works.

It finds the broker and token like the rest of the CLI (`--api`/`--token`, `SOUK_API`/
`SOUK_TOKEN`, or `souk dev`'s files).
"""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from types import TracebackType
from typing import Any

import aiohttp

from souk.cli.client import api_token, api_url
from souk.models.api import NONCE_HEADER


class ApiError(Exception):
    """The broker refused (its status and reason), or could not be reached (status 0)."""

    def __init__(
        self, http_status: int, reason: str, message: str, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.http_status = http_status
        self.reason = reason
        self.message = message
        self.details = details or {}

    def __str__(self) -> str:
        if self.http_status == 0:
            return self.message
        text = f"{self.http_status} {self.reason}: {self.message}"
        for refusal in self.details.get("refusals", []):
            text += f"\n  {refusal.get('worker')}: {refusal.get('reason')}"
        return text


class Api:
    """One pooled session; safe to share across tasks. Use as `async with Api(...) as api`."""

    def __init__(self, api: str | None = None, token: str | None = None, timeout: float = 60):
        self.base = api_url(api)
        self.token = api_token(token)
        self.timeout = timeout
        self._session: aiohttp.ClientSession | None = None

    async def __aenter__(self) -> Api:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            self._session = aiohttp.ClientSession(
                headers={"Authorization": f"Bearer {self.token}"},
                timeout=aiohttp.ClientTimeout(total=self.timeout, sock_connect=10),
            )
        return self._session

    async def close(self) -> None:
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        nonce: str | None = None,
    ) -> Any:
        headers = {NONCE_HEADER: nonce} if nonce else {}
        url = self.base + path
        try:
            async with self.session.request(
                method, url, json=body, params=params, headers=headers
            ) as resp:
                payload = await resp.read()
                if resp.status >= 400:
                    raise _error(resp.status, payload)
        except aiohttp.ClientError as exc:
            raise ApiError(0, "unreachable", f"cannot reach {url}: {exc}") from None
        except TimeoutError:
            raise ApiError(0, "unreachable", f"no answer from {url} in time") from None
        return json.loads(payload) if payload else None

    async def text(self, path: str, params: dict[str, str] | None = None) -> str:
        url = self.base + path
        try:
            async with self.session.get(url, params=params) as resp:
                payload = await resp.read()
                if resp.status >= 400:
                    raise _error(resp.status, payload)
        except aiohttp.ClientError as exc:
            raise ApiError(0, "unreachable", f"cannot reach {url}: {exc}") from None
        return payload.decode(errors="replace")

    async def stream(self, path: str, params: dict[str, str]) -> AsyncIterator[bytes]:
        """A body as it arrives, for as long as the server sends it (`logs --follow`)."""
        url = self.base + path
        timeout = aiohttp.ClientTimeout(total=None, sock_connect=10)
        try:
            async with self.session.get(url, params=params, timeout=timeout) as resp:
                if resp.status >= 400:
                    raise _error(resp.status, await resp.read())
                async for chunk in resp.content.iter_any():
                    yield chunk
        except aiohttp.ClientError as exc:
            raise ApiError(0, "unreachable", f"cannot reach {url}: {exc}") from None

    # --- apps ----------------------------------------------------------------------------

    async def ensure_app(self, app: str) -> bool:
        """Create the app unless it exists; True if it was created."""
        try:
            await self.call("GET", f"/v1/apps/{app}")
            return False
        except ApiError as exc:
            if exc.http_status != 404:
                raise
        try:
            await self.call("POST", "/v1/apps", {"name": app})
        except ApiError as exc:
            if exc.reason != "already_exists":
                raise
            return False
        return True

    async def app_metadata(self, app: str) -> dict[str, str]:
        data = await self.call("GET", f"/v1/apps/{app}/metadata")
        return dict(data or {})

    async def patch_app_metadata(
        self, app: str, set_: dict[str, str] | None = None, delete: list[str] | None = None
    ) -> None:
        await self.call(
            "PATCH", f"/v1/apps/{app}/metadata", {"set": set_ or {}, "delete": delete or []}
        )

    # --- machines ------------------------------------------------------------------------

    def _m(self, app: str, mid: str = "", verb: str = "") -> str:
        path = f"/v1/apps/{app}/machines"
        if mid:
            path += f"/{mid}"
        if verb:
            path += f"/{verb}"
        return path

    async def machines(self, app: str) -> list[dict[str, Any]]:
        return list(await self.call("GET", self._m(app)))

    async def machine(self, app: str, mid: str) -> dict[str, Any]:
        return dict(await self.call("GET", self._m(app, mid)))

    async def create(self, app: str, body: dict[str, Any]) -> dict[str, Any]:
        return dict(await self.call("POST", self._m(app), body))

    async def update(
        self, app: str, mid: str, body: dict[str, Any], nonce: str | None
    ) -> dict[str, Any]:
        return dict(await self.call("POST", self._m(app, mid), body, nonce=nonce))

    async def action(self, app: str, mid: str, verb: str, nonce: str | None) -> Any:
        return await self.call("POST", self._m(app, mid, verb), {}, nonce=nonce)

    async def destroy(
        self, app: str, mid: str, nonce: str | None, force: bool = True, wait: float = 30
    ) -> None:
        """Destroy, and (with `wait`) return once it is destroyed: its process is gone."""
        params = {"force": "true"} if force else None
        try:
            await self.call("DELETE", self._m(app, mid), params=params, nonce=nonce)
            if wait:
                await self.wait(app, mid, "destroyed", wait)
        except ApiError as exc:
            if exc.http_status != 404:
                raise

    async def wait(self, app: str, mid: str, state: str, timeout: float) -> bool:
        """Whether the machine reached `state` within `timeout` seconds (at most 60)."""
        params = {"state": state, "timeout": f"{min(timeout, 60):g}"}
        try:
            await self.call("GET", self._m(app, mid, "wait"), params=params)
        except ApiError as exc:
            if exc.http_status == 408:
                return False
            raise
        return True

    async def patch_metadata(
        self, app: str, mid: str, changes: dict[str, str | None], nonce: str | None
    ) -> None:
        await self.call("PATCH", self._m(app, mid, "metadata"), {"metadata": changes}, nonce=nonce)

    async def lease(
        self, app: str, mid: str, ttl: int, description: str, nonce: str | None = None
    ) -> dict[str, Any]:
        body = {"ttl": ttl, "description": description}
        return dict(await self.call("POST", self._m(app, mid, "lease"), body, nonce=nonce))

    async def get_lease(self, app: str, mid: str) -> dict[str, Any] | None:
        try:
            return dict(await self.call("GET", self._m(app, mid, "lease")))
        except ApiError as exc:
            if exc.http_status == 404:
                return None
            raise

    async def release_lease(self, app: str, mid: str, nonce: str) -> None:
        await self.call("DELETE", self._m(app, mid, "lease"), nonce=nonce)

    async def logs(self, app: str, mid: str, stream: str = "stdout") -> str:
        return await self.text(self._m(app, mid, "logs"), {"stream": stream})


def _error(status: int, payload: bytes) -> ApiError:
    try:
        body = json.loads(payload)
        return ApiError(
            status,
            str(body.get("status", "error")),
            str(body.get("error", "")),
            body.get("details") if isinstance(body.get("details"), dict) else None,
        )
    except (ValueError, AttributeError):
        return ApiError(status, "error", payload.decode(errors="replace")[:500])
