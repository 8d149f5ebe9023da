"""Which app a request is for, and which of its machines answers it.

Backends are the app's started machines from the catalog, minus those the proxy must not use:
hidden (a blue/green deploy before its switch), cordoned, without an address or a service port,
on an unreachable worker, being stopped by this proxy, or that just refused a connection. The
proxy's own region comes first; within a tier, two machines are sampled and the one with fewer
requests in flight wins (power of two choices), first among machines under their soft limit,
then under their hard limit.

Every decision here is synchronous: choosing a machine and counting the request against it happen
without yielding to the event loop, so concurrent requests never overshoot a hard limit.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field

from souk.catalog.view import CatalogView
from souk.models.catalog import MachineRow
from souk.models.wire import CORDON_KEY, HIDDEN_KEY, ROLE_KEY
from souk.network import hostport
from souk.proxy.policy import Policies, ServicePolicy

APP_HEADER = "souk-app"
TRUE = frozenset({"true", "1", "yes"})

WOKEN_FOR = (
    15.0  # seconds a machine this proxy started counts as started before the catalog says so
)
STOPPING_FOR = 30.0  # seconds a machine this proxy is stopping stays out of rotation
FAILED_FOR = 2.0  # seconds a machine that refused a connection stays out of rotation


def app_of(host: str | None, header: str | None, domain: str) -> str | None:
    """The app named by the `souk-app` header, else by a Host of `<app>.<domain>`."""
    if header:
        return header.strip().lower() or None
    if not host:
        return None
    name = host.strip().lower().rstrip(".")
    if name.startswith("["):  # an IPv6 literal, never an app
        return None
    name = name.rsplit(":", 1)[0] if ":" in name else name
    suffix = "." + domain.lower().strip(".")
    if not name.endswith(suffix):
        return None
    app = name[: -len(suffix)]
    return app if app and "." not in app else None


@dataclass(frozen=True)
class Backend:
    """A machine as a forwarding target."""

    row: MachineRow
    host: str
    port: int

    @property
    def id(self) -> str:
        return self.row.id

    @property
    def url(self) -> str:
        return f"http://{hostport(self.host, self.port)}"


def backend_of(row: MachineRow) -> Backend | None:
    if not row.private_ip or not row.ports:
        return None
    return Backend(row, row.private_ip, row.ports[0])


def hidden(row: MachineRow) -> bool:
    return row.metadata.get(HIDDEN_KEY, "").lower() in TRUE


def cordoned(row: MachineRow) -> bool:
    return row.metadata.get(CORDON_KEY, "").lower() in TRUE


def is_standby(row: MachineRow) -> bool:
    return bool(row.standby_for) or row.metadata.get(ROLE_KEY) == "standby"


class Loads:
    """Requests in flight per machine, and when each was last used, as seen by this proxy."""

    def __init__(self) -> None:
        self.inflight: dict[str, int] = defaultdict(int)
        self.last_used: dict[str, float] = {}
        self._freed: dict[str, asyncio.Event] = {}

    def acquire(self, machine_id: str) -> None:
        self.inflight[machine_id] += 1
        self.last_used[machine_id] = time.monotonic()

    def release(self, machine_id: str, app: str) -> None:
        left = self.inflight[machine_id] - 1
        if left <= 0:
            self.inflight.pop(machine_id, None)
        else:
            self.inflight[machine_id] = left
        self.last_used[machine_id] = time.monotonic()
        event = self._freed.pop(app, None)
        if event is not None:
            event.set()

    def of(self, machine_id: str) -> int:
        return self.inflight.get(machine_id, 0)

    def touch(self, machine_id: str) -> None:
        self.last_used[machine_id] = time.monotonic()

    def freed(self, app: str) -> asyncio.Event:
        """Set at the next request of the app that ends (a slot may have opened)."""
        event = self._freed.get(app)
        if event is None:
            event = self._freed[app] = asyncio.Event()
        return event

    def forget(self, keep: Iterable[str]) -> None:
        alive = set(keep)
        for mid in [m for m in self.last_used if m not in alive and not self.inflight.get(m)]:
            del self.last_used[mid]


class Marks:
    """Short-lived local knowledge the catalog has not caught up with yet, by machine id."""

    def __init__(self) -> None:
        self._until: dict[str, dict[str, float]] = {"woken": {}, "stopping": {}, "failed": {}}
        self.woken_from: dict[str, str] = {}  # machine id -> its row's updated_at before the start

    def set(self, kind: str, machine_id: str, seconds: float) -> None:
        self._until[kind][machine_id] = time.monotonic() + seconds

    def clear(self, kind: str, machine_id: str) -> None:
        self._until[kind].pop(machine_id, None)
        if kind == "woken":
            self.woken_from.pop(machine_id, None)

    def woke(self, row: MachineRow, seconds: float = WOKEN_FOR) -> None:
        """This proxy started the machine (from the row as it was): it takes traffic now,
        whatever the catalog says, until the catalog shows a newer version of it."""
        self.set("woken", row.id, seconds)
        self.woken_from[row.id] = row.updated_at

    def woken(self, row: MachineRow) -> bool:
        """Started by this proxy and not yet shown otherwise by the catalog: the catalog still
        holds the row from before the start, or shows it starting. Stopped again after the
        start (a newer row), the mark is void."""
        if not self.has("woken", row.id):
            self.woken_from.pop(row.id, None)
            return False
        if row.state == "starting" or (
            row.state in ("created", "stopped", "suspended")
            and row.updated_at == self.woken_from.get(row.id)
        ):
            return True
        if row.state != "started":
            self.clear("woken", row.id)
        return False

    def has(self, kind: str, machine_id: str) -> bool:
        until = self._until[kind].get(machine_id)
        if until is None:
            return False
        if until < time.monotonic():
            del self._until[kind][machine_id]
            return False
        return True


@dataclass
class Choice:
    backend: Backend | None = None
    serving: int = 0  # machines that could serve, at their limit or not
    over_soft: bool = False  # the chosen one (or all) are past their soft limit
    lost: list[MachineRow] = field(default_factory=list)  # started, on an unreachable worker


class Router:
    def __init__(
        self,
        view: CatalogView,
        policies: Policies,
        loads: Loads,
        marks: Marks,
        region: str | None = None,
        rng: random.Random | None = None,
    ) -> None:
        self.view = view
        self.policies = policies
        self.loads = loads
        self.marks = marks
        self.region = region
        self.rng = rng or random.Random()

    def reachable(self, row: MachineRow) -> bool:
        worker = self.view.worker(row.worker_id)
        return worker is not None and not worker.unreachable

    def routable(self, row: MachineRow) -> bool:
        """Could take traffic once started."""
        return not hidden(row) and not cordoned(row) and backend_of(row) is not None

    def serving(self, row: MachineRow) -> bool:
        """Takes traffic now (or was just started by this proxy)."""
        if self.marks.has("stopping", row.id) or self.marks.has("failed", row.id):
            return False
        if row.state != "started" and not self.marks.woken(row):
            return False
        return self.routable(row) and self.reachable(row)

    def choose(self, app: str, exclude: frozenset[str] = frozenset()) -> Choice:
        """Picks a backend and counts the request against it (release via `Loads.release`)."""
        choice = Choice()
        own: list[tuple[MachineRow, ServicePolicy]] = []
        other: list[tuple[MachineRow, ServicePolicy]] = []
        for row in self.view.machines(app=app):
            if row.id in exclude:
                continue
            if not self.serving(row):
                if row.state == "started" and self.routable(row) and not self.reachable(row):
                    choice.lost.append(row)
                continue
            entry = (row, self.policies.of(row))
            (own if self.region is not None and row.region == self.region else other).append(entry)
        choice.serving = len(own) + len(other)
        for soft in (True, False):
            for tier in (own, other):
                open_ = [(r, p) for r, p in tier if self._below(r, p, soft)]
                if open_:
                    row = self._two_choices(open_)
                    backend = backend_of(row)
                    assert backend is not None  # routable
                    choice.backend = backend
                    choice.over_soft = not soft
                    self.loads.acquire(row.id)
                    return choice
        choice.over_soft = choice.serving > 0
        return choice

    def _below(self, row: MachineRow, policy: ServicePolicy, soft: bool) -> bool:
        limit = policy.soft_limit if soft else policy.hard_limit
        return limit is None or self.loads.of(row.id) < limit

    def _two_choices(self, rows: list[tuple[MachineRow, ServicePolicy]]) -> MachineRow:
        if len(rows) == 1:
            return rows[0][0]
        (a, _), (b, _) = self.rng.sample(rows, 2)
        la, lb = self.loads.of(a.id), self.loads.of(b.id)
        if la == lb:
            return a  # sampled in random order already
        return a if la < lb else b

    def known(self, app: str) -> bool:
        """Whether the catalog shows the app at all (a machine in any state but destroyed)."""
        if any(row.state != "destroyed" for row in self.view.machines(app=app)):
            return True
        return bool(self.view.regions_of_app(app))
