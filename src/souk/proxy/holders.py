"""A request goes only to a socket its machine holds.

A host command's private address is a loopback one (127.x), in the host's network namespace,
where any process may bind any address: a machine of another app can bind a stopped machine's
address and port, and would then be sent that machine's requests, credentials and all. So each
connection the proxy opens to a loopback backend is checked before anything is sent on it: the
kernel says which listening socket a connection to that address and port reaches
(`souk.listeners`, sock_diag over netlink), and the machine's worker says whether the machine's
processes hold that socket (`GET /v1/machines/{id}/sockets/{inode}`). The answer is kept per
machine instance and socket cookie (a cookie is never given to another socket), so the worker
is asked once per listener, not once per connection; pooled connections are not checked again,
they already lead to the checked socket. A container's address is in a network namespace of its
own, which no other machine can bind in: those connections are not checked.
"""

from __future__ import annotations

import asyncio
import ipaddress
import logging
from contextvars import ContextVar
from typing import TYPE_CHECKING

import aiohttp
from aiohttp.client_proto import ResponseHandler
from aiohttp.client_reqrep import ClientRequest

from souk import listeners
from souk.catalog.view import CatalogView
from souk.clients.workers import WorkerCallError, WorkerClient
from souk.proxy.routing import Backend

if TYPE_CHECKING:
    from aiohttp.tracing import Trace

log = logging.getLogger("souk.proxy.holders")

CHECK_TIMEOUT = 5.0
KEEP = 10_000  # machine instances whose checked sockets are kept, at most

# The backend a request of the backends' session is meant for, set around each request.
TARGET: ContextVar[Backend | None] = ContextVar("souk_proxy_target", default=None)


class ForeignListener(aiohttp.ClientConnectionError):
    """The connection reached a socket its machine does not hold (or that could not be told):
    closed before anything was sent. `code` and `status` are the client's answer if no other
    machine takes the request."""

    def __init__(self, backend: Backend | None, code: str, status: int, message: str) -> None:
        super().__init__(message)
        self.backend = backend
        self.code = code
        self.status = status
        self.message = message


class Holders:
    """Checks that what listens at a backend's address is held by the backend's machine."""

    def __init__(self, view: CatalogView, workers: WorkerClient) -> None:
        self.view = view
        self.workers = workers
        self._held: dict[tuple[str, str], set[bytes]] = {}  # (machine, instance) -> cookies
        self._asking: dict[tuple[str, str, bytes], asyncio.Task[bool]] = {}

    async def check(self, backend: Backend) -> None:
        """Raises `ForeignListener` unless every socket a connection to the backend reaches is
        held by its machine's processes."""
        try:
            if not ipaddress.ip_address(backend.host).is_loopback:
                return
            takers = listeners.takers(backend.host, backend.port)
        except (ValueError, OSError) as exc:  # not an address; no sock_diag here
            raise self._unverified(backend, f"what listens there is not known: {exc}") from None
        if not takers:
            raise self._refusal(backend, "nothing listens there any more")
        row = backend.row
        known = self._held.get((row.id, row.instance_id))
        for socket in takers:
            if known is not None and socket.cookie in known:
                continue
            if not await self._ask(backend, socket):
                raise self._refusal(
                    backend, f"the socket listening there (uid {socket.uid}) is not the machine's"
                )
            if len(self._held) >= KEEP:
                self._held.clear()
            known = self._held.setdefault((row.id, row.instance_id), set())
            known.add(socket.cookie)

    async def _ask(self, backend: Backend, socket: listeners.Listener) -> bool:
        """The worker's answer, one question at a time per machine and socket."""
        key = (backend.row.id, backend.row.instance_id, socket.cookie)
        task = self._asking.get(key)
        if task is None:
            task = asyncio.ensure_future(self._holds(backend, socket.inode))
            self._asking[key] = task
            task.add_done_callback(lambda _: self._asking.pop(key, None))
        return await asyncio.shield(task)

    async def _holds(self, backend: Backend, inode: int) -> bool:
        row = backend.row
        worker = self.view.worker(row.worker_id)
        if worker is None:
            raise self._unverified(backend, f"its worker {row.worker_id} is not in the catalog")
        try:
            return await self.workers.holds_socket(
                worker.id, worker.address, row.id, inode, timeout=CHECK_TIMEOUT
            )
        except WorkerCallError as exc:
            raise self._unverified(backend, f"its worker could not say: {exc}") from None

    def _refusal(self, backend: Backend, why: str) -> ForeignListener:
        message = (
            f"{backend.host}:{backend.port} is not {backend.id}'s: {why}; nothing was sent to it"
        )
        log.warning("refused to send a request of %s there: %s", backend.row.app, message)
        return ForeignListener(backend, "foreign_listener", 502, message)

    def _unverified(self, backend: Backend, why: str) -> ForeignListener:
        message = (
            f"whether {backend.id} holds the socket at {backend.host}:{backend.port} is not"
            f" known ({why}); nothing was sent to it"
        )
        log.warning("refused to send a request of %s there: %s", backend.row.app, message)
        return ForeignListener(backend, "listener_unverified", 503, message)


class CheckedConnector(aiohttp.TCPConnector):
    """The backends' connector: each connection it opens is checked by `holders` (for the
    backend in `TARGET`) before it is used, and closed if the check fails."""

    def __init__(self, holders: Holders, **kwargs: object) -> None:
        super().__init__(**kwargs)  # type: ignore[arg-type]
        self.holders = holders

    async def _create_connection(
        self, req: ClientRequest, traces: list[Trace], timeout: aiohttp.ClientTimeout
    ) -> ResponseHandler:
        proto = await super()._create_connection(req, traces, timeout)
        try:
            backend = TARGET.get()
            if backend is None or (req.url.host, req.url.port) != (backend.host, backend.port):
                raise ForeignListener(
                    backend,
                    "foreign_listener",
                    502,
                    f"{req.url.host}:{req.url.port} is not the machine this request was for",
                )
            await self.holders.check(backend)
        except BaseException:
            proto.close()
            raise
        return proto
