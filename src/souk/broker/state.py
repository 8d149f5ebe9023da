"""What every handler shares: the fleet, the worker client, the placer and the app registry,
held by one `Broker` that the aiohttp app carries under `BROKER`."""

from __future__ import annotations

import asyncio
import contextlib
from collections import OrderedDict
from collections.abc import Awaitable, Callable

from aiohttp import web

from souk.broker.fleet import Fleet
from souk.broker.placement.pipeline import Placer
from souk.broker.placement.reservation import TAG_LENGTH, worker_tag
from souk.broker.registry import AppRegistry
from souk.clients.workers import WorkerClient
from souk.models.catalog import AppRow, WorkerRow
from souk.models.machine import Machine
from souk.sealing import Sealer
from souk.web import ApiError

HINTS = 100_000
OPENED_APPS = 10_000  # apps whose secrets are kept opened, at most
FIND_TIMEOUT = 2.0  # for asking a worker about a machine the catalog does not show yet


class Broker:
    """Everything a handler needs. No state of record: only hints of where machines are.

    Calls to a machine's worker raise `WorkerCallError` as it comes; the app's `worker_errors`
    middleware states it in the public API's terms, once for every handler."""

    def __init__(
        self,
        fleet: Fleet,
        client: WorkerClient,
        placer: Placer,
        registry: AppRegistry | None = None,
        registry_url: str | None = None,
        before_place: Callable[[], Awaitable[None]] | None = None,
        default_region: str | None = None,
    ) -> None:
        self.fleet = fleet
        self.client = client
        self.placer = placer
        # Where this broker writes apps if it hosts the registry (else it forwards writes to
        # `registry_url`). Reads go through the fleet, which alone knows which of the registry
        # and the replica answers for apps.
        self.registry = registry
        self.registry_url = registry_url
        self.before_place = before_place
        # Where a create that names no region goes; None: the best offer of every region.
        self.default_region = default_region
        # machine id -> (app, worker id, address): machines this broker just created, which the
        # catalog may not show for a few milliseconds more.
        self._hints: OrderedDict[str, tuple[str, str, str]] = OrderedDict()
        # app -> (its row, its secrets opened from that row): a row is the same object until the
        # app changes, so its secrets are opened once per version (`machine_secrets`).
        self.opened: dict[str, tuple[AppRow, dict[str, str]]] = {}

    # --- finding things ------------------------------------------------------------------

    def require_app(self, name: str) -> AppRow:
        row = self.fleet.app(name)
        if row is None:
            raise ApiError(404, "not_found", f"app {name} not found")
        return row

    def hint(self, machine: Machine, address: str) -> None:
        self._hints[machine.id] = (machine.app, machine.worker, address)
        self._hints.move_to_end(machine.id)
        while len(self._hints) > HINTS:
            self._hints.popitem(last=False)

    def locate(self, app: str, machine_id: str) -> tuple[str, str]:
        """(worker id, address) of the worker holding the machine, or 404."""
        row = self.fleet.machine(machine_id)
        if row is not None and row.app == app:
            worker = self.fleet.worker(row.worker_id)
            if worker is not None:
                return worker.id, worker.address
        hinted = self._hints.get(machine_id)
        if hinted is not None and hinted[0] == app:
            return hinted[1], hinted[2]
        raise ApiError(404, "not_found", f"machine {machine_id} not found in app {app}")

    def app_workers(self, app: str, region: str | None) -> dict[str, str]:
        found = {m.worker_id for m in self.fleet.machines(app=app) if region in (None, m.region)}
        out: dict[str, str] = {}
        for wid in found:
            worker = self.fleet.worker(wid)
            if worker is not None:
                out[wid] = worker.address
        for h_app, wid, address in self._hints.values():
            if h_app == app and wid not in out:
                worker = self.fleet.worker(wid)
                if region is None or worker is None or worker.region == region:
                    out[wid] = address
        return out

    async def find(self, app: str, machine_id: str) -> tuple[str, str]:
        """As `locate`, and for a machine this broker's catalog does not show yet (created
        through another broker a moment ago): ask the workers whose tag ends its id, in
        parallel, and keep the answer as a hint. Read-your-writes across brokers, at the cost
        of a round trip to a worker or two, paid only by an id nobody here knows."""
        try:
            return self.locate(app, machine_id)
        except ApiError:
            pass
        found = await self._asked(app, [(w, machine_id) for w in self.tagged(machine_id)])
        if found is None:
            raise ApiError(404, "not_found", f"machine {machine_id} not found in app {app}")
        return found[0].id, found[0].address

    async def keyed(self, app: str, prefix: str, region: str | None) -> Machine | None:
        """The machine an earlier create with the same idempotency key made (its id starts with
        `prefix`), if any: from the catalog or the hints, else by asking each of the region's
        workers for the id it would have there (a create through another broker a moment ago)."""
        ids = [m.id for m in self.fleet.machines(app=app) if m.id.startswith(prefix)]
        ids += [mid for mid, h in self._hints.items() if h[0] == app and mid.startswith(prefix)]
        for mid in ids:
            with contextlib.suppress(ApiError):
                return await self.machine(app, mid)
        rows = self.fleet.workers(region=region, reachable_only=False)
        found = await self._asked(app, [(w, prefix + worker_tag(w.id)) for w in rows])
        return found[1] if found is not None else None

    def tagged(self, given_id: str) -> list[WorkerRow]:
        """The workers whose tag ends an id this broker gave (a machine's, a volume's): the
        only ones that may hold it."""
        tag = given_id[-TAG_LENGTH:]
        return [w for w in self.fleet.workers(reachable_only=False) if worker_tag(w.id) == tag]

    async def _asked(
        self, app: str, asks: list[tuple[WorkerRow, str]]
    ) -> tuple[WorkerRow, Machine] | None:
        """Each worker asked for the machine of its id, all at once: the first that holds one of
        `app`, kept as a hint, or None."""
        found = await asyncio.gather(
            *(self.client.machine(w.id, w.address, mid, FIND_TIMEOUT) for w, mid in asks),
            return_exceptions=True,
        )
        for (worker, _), machine in zip(asks, found, strict=True):
            if isinstance(machine, Machine) and machine.app == app:
                self.hint(machine, worker.address)
                return worker, machine
        return None

    # --- calling a machine's worker ------------------------------------------------------

    async def machine(self, app: str, machine_id: str) -> Machine:
        """The machine as its worker has it now; 404 unless it belongs to `app`."""
        worker, address = await self.find(app, machine_id)
        machine = await self.client.machine(worker, address, machine_id)
        if machine.app != app:
            raise ApiError(404, "not_found", f"machine {machine_id} not found in app {app}")
        return machine


BROKER = web.AppKey("broker", Broker)
IDEMPOTENCY = web.AppKey("idempotency", bytes)  # the key of keyed creates' ids, from the secret
SEALER = web.AppKey("sealer", Sealer)  # made from the cluster secret, with the app


def broker_of(request: web.Request) -> Broker:
    return request.app[BROKER]


def sealer_of(request: web.Request) -> Sealer:
    return request.app[SEALER]
