"""What every handler shares: the fleet, the worker client, the placer and the app registry,
held by one `Broker` that the aiohttp app carries under `BROKER`."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Awaitable, Callable

from aiohttp import web

from souk.broker.fleet import Fleet
from souk.broker.placement.pipeline import Placer
from souk.broker.registry import AppRegistry
from souk.broker.sealing import Sealer
from souk.clients.workers import WorkerClient
from souk.models.catalog import AppRow
from souk.models.machine import Machine
from souk.web import ApiError

HINTS = 100_000


class Broker:
    """Everything a handler needs. No state of record: only hints of where machines are.

    Calls to a machine's worker raise `WorkerError` as it comes; the app's `worker_errors`
    middleware states it in the public API's terms, once for every handler."""

    def __init__(
        self,
        fleet: Fleet,
        client: WorkerClient,
        placer: Placer,
        registry: AppRegistry | None = None,
        registry_url: str | None = None,
        before_place: Callable[[], Awaitable[None]] | None = None,
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
        # machine id -> (app, worker id, address): machines this broker just created, which the
        # catalog may not show for a few milliseconds more.
        self._hints: OrderedDict[str, tuple[str, str, str]] = OrderedDict()

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

    # --- calling a machine's worker ------------------------------------------------------

    async def machine(self, app: str, machine_id: str) -> Machine:
        """The machine as its worker has it now; 404 unless it belongs to `app`."""
        worker, address = self.locate(app, machine_id)
        machine = await self.client.machine(worker, address, machine_id)
        if machine.app != app:
            raise ApiError(404, "not_found", f"machine {machine_id} not found in app {app}")
        return machine


BROKER = web.AppKey("broker", Broker)
SEALER = web.AppKey("sealer", Sealer)  # made from the cluster secret, with the app


def broker_of(request: web.Request) -> Broker:
    return request.app[BROKER]


def sealer_of(request: web.Request) -> Sealer:
    return request.app[SEALER]
