"""Starting machines on demand: scale from zero, more room under load, standbys on failover.

Requests for an app with no machine able to take them wait while one stopped machine is started
through the broker (`start`, then `wait?state=started`, then TCP connects until its port
accepts). However many requests wait, one start is under way per app at a time (single flight):
they all share its outcome. The machine then counts as started for this proxy until the
catalog says so itself, so requests arriving just after do not start another one.

Which stopped machine: the standby of a machine this proxy saw lost, then primaries (machines
that stand by for nobody), then other standbys; within each, the proxy's own region first, then
the app's other regions. Only machines whose service has autostart on (the default) are
started for traffic; a lost machine's standby is started whatever its autostart says.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import logging
import socket
import time
from collections.abc import Coroutine
from typing import Any

from souk.clients.machines import MachinesApiError, MachinesClient
from souk.logsetup import about
from souk.models.catalog import MachineRow
from souk.proxy.metrics import ProxyMetrics
from souk.proxy.routing import Backend, Router, backend_of, is_standby
from souk.readiness import ready

log = logging.getLogger("souk.proxy.wake")

STARTABLE = ("stopped", "created", "suspended")  # a start resumes a suspended one
# A just-started app binds its port within tens of milliseconds, and each poll's interval is
# added to the first request's wait: connects every 2 ms at first (a refused connect costs tens
# of microseconds), every 20 ms once the app has taken longer than a quarter of a second.
CONNECT_FIRST_EVERY, CONNECT_FIRST_FOR = 0.002, 0.25
CONNECT_EVERY = 0.02
STANDBY_AGAIN_AFTER = 30.0  # seconds before the same lost machine triggers its standby again
LOST_FOR = 300.0  # seconds a lost machine's standby is preferred when waking its app


async def port_open(host: str, port: int, deadline: float) -> bool:
    """Polls a TCP connect until it is accepted or the (monotonic) deadline passes."""
    fast_until = time.monotonic() + CONNECT_FIRST_FOR
    while True:
        left = deadline - time.monotonic()
        if left <= 0:
            return False
        if await accepts(host, port, min(left, 1.0)):
            return True
        now = time.monotonic()
        every = CONNECT_FIRST_EVERY if now < fast_until else CONNECT_EVERY
        await asyncio.sleep(min(every, max(0.0, deadline - now)))


async def accepts(host: str, port: int, timeout: float) -> bool:
    """Whether one TCP connect to `host` (an IP address, as a machine's private address is:
    no name is looked up) is accepted within `timeout`; closed at once.

    Told by the socket's error number rather than by asyncio's streams, which raise for each
    refusal: an exception's traceback holds its frames and their futures in reference cycles,
    about 80 objects a refusal and 800 a start polled until its app binds, which only the
    collector frees, in a pause that stalls every request of the proxy (11 ms every 25 starts,
    docs/benchmarks.md)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.setblocking(False)
        error = sock.connect_ex((host, port))
        if error == errno.EINPROGRESS:
            try:
                async with asyncio.timeout(timeout):
                    await ready(sock.fileno(), "write")
            except TimeoutError:
                return False
            error = sock.getsockopt(socket.SOL_SOCKET, socket.SO_ERROR)
        return error == 0


class Waker:
    def __init__(self, router: Router, broker: MachinesClient, start_timeout: float = 10.0) -> None:
        """Works on the router's view of the fleet, its loads, marks and service settings."""
        self.broker = broker
        self.router = router
        self.start_timeout = start_timeout
        self._flights: dict[str, asyncio.Task[Backend | None]] = {}
        self._lost: dict[str, tuple[str, float]] = {}  # lost machine id -> (app, when seen)
        self._tasks: set[asyncio.Task[Any]] = set()
        self.starting: set[str] = set()  # machines being started by a flight, until they accept
        self.starts = 0  # machines this proxy asked the broker to start
        self.metrics: ProxyMetrics | None = None

    # --- scale from zero / more room ---------------------------------------------------------

    async def wake(self, app: str) -> Backend | None:
        """A freshly started machine of the app, or None if none could be started in time.
        Concurrent callers for one app share one start."""
        task = self._flights.get(app)
        if task is None:
            task = asyncio.create_task(self._wake(app))
            self._flights[app] = task
            task.add_done_callback(lambda _: self._flights.pop(app, None))
        return await asyncio.shield(task)

    def wake_soon(self, app: str) -> None:
        """Start one more machine in the background (everything is past its soft limit)."""
        if app not in self._flights:
            self._spawn(self.wake(app))

    def waking(self, app: str) -> bool:
        return app in self._flights

    async def _wake(self, app: str) -> Backend | None:
        deadline = time.monotonic() + self.start_timeout
        candidates = self.candidates(app)
        if not candidates:
            return None
        await self._known_settings(candidates, deadline)
        lost = self.lost_ids(app)
        for row in candidates:
            if not (self.router.policies.of(row).autostart or set(row.standby_for) & lost):
                continue
            if time.monotonic() >= deadline:
                break
            backend = await self._start(row, deadline)
            if backend is not None:
                return backend
        return None

    async def _known_settings(self, rows: list[MachineRow], deadline: float) -> None:
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(
                self.router.policies.ensure(rows), max(0.1, deadline - time.monotonic())
            )

    def candidates(self, app: str) -> list[MachineRow]:
        """Stopped (or suspended) machines that could serve once started, best first."""
        lost = self.lost_ids(app)
        regions = self.router.view.regions_of_app(app)
        own = self.router.region

        def rank(row: MachineRow) -> tuple[int, int, int, str]:
            if set(row.standby_for) & lost:
                group = 0
            elif not is_standby(row):
                group = 1
            else:
                group = 2
            if own is not None and row.region == own:
                where = 0
            elif row.region in regions:
                where = 1 + regions.index(row.region)
            else:
                where = 1 + len(regions)
            return (group, where, 0 if row.state == "suspended" else 1, row.id)  # resumes first

        rows = [
            row
            for row in self.router.view.machines(app=app)
            if row.state in STARTABLE
            and not self.router.marks.woken(row)
            and self.router.routable(row)
            and self.router.reachable(row)
        ]
        return sorted(rows, key=rank)

    async def _start(self, row: MachineRow, deadline: float) -> Backend | None:
        backend = backend_of(row)
        if backend is None:
            return None
        log.info(
            "starting %s of %s in %s on demand",
            row.id,
            row.app,
            row.region,
            extra=about(row.id, row.state, app=row.app),
        )
        self.starts += 1
        began = time.perf_counter()
        self.router.marks.clear("stopping", row.id)
        # In use while it starts: a machine slower to accept than the idle timeout must not be
        # stopped by autostop under the request that woke it.
        self.router.loads.acquire(row.id)
        self.starting.add(row.id)
        try:
            if not await self._started(row, backend, deadline):
                if self.metrics is not None:
                    self.metrics.cold_starts["failed"].inc()
                return None
        finally:
            self.starting.discard(row.id)
            self.router.loads.release(row.id, row.app)
        if self.metrics is not None:
            self.metrics.cold_starts["ok"].inc()
            self.metrics.cold_start_seconds.observe(time.perf_counter() - began)
        self.router.marks.woke(row)
        self.router.marks.clear("failed", row.id)
        return backend

    async def _started(self, row: MachineRow, backend: Backend, deadline: float) -> bool:
        try:
            await self.broker.start(row.app, row.id)
            left = deadline - time.monotonic()
            if left <= 0 or not await self.broker.wait(row.app, row.id, "started", left):
                log.warning("%s of %s did not start in time", row.id, row.app)
                return False
        except MachinesApiError as exc:
            log.warning("could not start %s of %s: %s", row.id, row.app, exc)
            return False
        if not await port_open(backend.host, backend.port, deadline):
            log.warning("%s of %s started but %s does not accept", row.id, row.app, backend.url)
            return False
        return True

    # --- failover ------------------------------------------------------------------------------

    def lost(self, row: MachineRow) -> None:
        """The machine refused a connection or its worker went silent: start its standby."""
        now = time.monotonic()
        seen = self._lost.get(row.id)
        if seen is not None and now - seen[1] < STANDBY_AGAIN_AFTER:
            return
        for mid in [m for m, (_, t) in self._lost.items() if now - t > LOST_FOR]:
            del self._lost[mid]
        self._lost[row.id] = (row.app, now)
        standbys = [
            m
            for m in self.router.view.machines(app=row.app)
            if row.id in m.standby_for
            and m.state in STARTABLE
            and self.router.reachable(m)
            and backend_of(m) is not None
        ]
        if not standbys:
            log.info("%s of %s is lost and has no stopped standby", row.id, row.app)
            return
        standby = standbys[0]
        log.info("%s of %s is lost: starting its standby %s", row.id, row.app, standby.id)
        self._spawn(self._start(standby, time.monotonic() + self.start_timeout))

    def lost_ids(self, app: str) -> set[str]:
        now = time.monotonic()
        return {m for m, (a, t) in self._lost.items() if a == app and now - t <= LOST_FOR}

    def _spawn(self, coro: Coroutine[Any, Any, Any]) -> None:
        task = asyncio.create_task(coro)
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def close(self) -> None:
        tasks = [*self._tasks, *self._flights.values()]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task
