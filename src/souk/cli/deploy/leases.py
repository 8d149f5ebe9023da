"""The lease protocol that keeps two deploys apart.

Every machine a deploy touches is leased first (created machines come with their lease), the
leases are refreshed in the background while it works and released at the end, so a second
deploy of the same app is refused at its first lease. An app with no machines yet has nothing
to lease: its advisory `deploy.lock` metadata covers it.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import secrets
import time
from collections.abc import AsyncIterator, Iterable

from souk.cli.deploy.errors import DeployInProgress
from souk.cli.deploy.releases import LOCK, AppRecord, Lock
from souk.clients.machines import MachinesApiError, MachinesClient
from souk.models.api import CreateLeaseRequest
from souk.models.machine import MetadataChange
from souk.node.periodic import every

LEASE_TTL = 30
log = logging.getLogger("souk.deploy")


class Leases:
    """The deploy's leases: acquired before a change, refreshed while working (`kept`),
    released at the end. Also keeps the app's advisory `deploy.lock` fresh."""

    def __init__(
        self, api: MachinesClient, app: str, description: str, ttl: int = LEASE_TTL
    ) -> None:
        self.api = api
        self.app = app
        self.ttl = ttl
        self.request = CreateLeaseRequest(ttl=ttl, description=description)
        self.owner = secrets.token_hex(8)
        self.release = 0
        self.nonces: dict[str, str] = {}
        self._locked = False

    @contextlib.asynccontextmanager
    async def kept(self) -> AsyncIterator[Leases]:
        """Refreshed in the background while inside; every lease and the lock let go after,
        whatever happened."""
        task = asyncio.create_task(
            every(self.ttl / 3, self._refresh, what="lease refresh", log=log)
        )
        try:
            yield self
        finally:
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await task
            await asyncio.gather(
                *(self._release(mid, nonce) for mid, nonce in self.nonces.items()),
                return_exceptions=True,
            )
            self.nonces.clear()
            if self._locked:
                with contextlib.suppress(MachinesApiError):
                    held = (await AppRecord.read(self.api, self.app)).lock
                    if held is None or held.owner == self.owner:
                        await self.api.patch_app_metadata(self.app, MetadataChange(delete=[LOCK]))

    async def lock_app(self, release: int) -> None:
        """Take the app's advisory lock, unless another live deploy holds it."""
        self._refuse_if_held((await AppRecord.read(self.api, self.app)).lock)
        self.release = release
        await self._write_lock()
        self._locked = True
        held = (await AppRecord.read(self.api, self.app)).lock
        if held is not None and held.owner != self.owner:
            self._locked = False
        self._refuse_if_held(held)

    def _refuse_if_held(self, held: Lock | None) -> None:
        if held is not None and held.owner != self.owner:
            raise DeployInProgress(
                f"deploy in progress: release {held.release} of {self.app} is being deployed",
                release=held.release,
            )

    async def _write_lock(self) -> None:
        lock = Lock(owner=self.owner, release=self.release, expires_at=time.time() + self.ttl)
        change = MetadataChange(set={LOCK: lock.model_dump_json()})
        await self.api.patch_app_metadata(self.app, change)

    async def acquire(self, ids: Iterable[str]) -> None:
        """Lease every machine, in id order, the first alone: of two deploys starting at once,
        exactly one gets the first lease and the other stops there."""
        todo = sorted(set(ids) - set(self.nonces))
        if not todo:
            return
        await self._acquire_one(todo[0])
        results = await asyncio.gather(
            *(self._acquire_one(mid) for mid in todo[1:]), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _acquire_one(self, mid: str) -> None:
        try:
            lease = await self.api.lease(self.app, mid, self.request)
        except MachinesApiError as exc:
            if exc.reason != "lease_held":
                raise
            held = await self.api.get_lease(self.app, mid)
            what = f" ({held.description})" if held and held.description else ""
            raise DeployInProgress(
                f"deploy in progress: machine {mid} of {self.app} is leased{what}",
                machine=mid,
                lease=held.model_dump() if held else None,
            ) from None
        self.nonces[mid] = lease.nonce

    def adopt(self, mid: str, nonce: str | None) -> None:
        if nonce:
            self.nonces[mid] = nonce

    def nonce(self, mid: str) -> str | None:
        return self.nonces.get(mid)

    def forget(self, mid: str) -> None:
        self.nonces.pop(mid, None)

    async def _release(self, mid: str, nonce: str) -> None:
        with contextlib.suppress(MachinesApiError):
            await self.api.release_lease(self.app, mid, nonce)

    async def _refresh(self) -> None:
        for mid, nonce in list(self.nonces.items()):
            with contextlib.suppress(MachinesApiError):
                await self.api.lease(self.app, mid, self.request, nonce)
        if self._locked:
            with contextlib.suppress(MachinesApiError):
                await self._write_lock()
