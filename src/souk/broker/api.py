"""The public Machines API, Fly-shaped: apps, machines, leases, metadata, plus fleet endpoints
for operators. Handlers are thin: find the machine's worker in the catalog, call it, translate."""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from typing import Any, cast, get_args

import aiohttp
from aiohttp import web

from souk.broker.auth import grant_of
from souk.broker.fleet import Fleet
from souk.broker.placement import POLICIES
from souk.broker.placer import NoCapacity, Placer
from souk.broker.registry import AppExists, AppNotFound, AppRegistry, MetadataRefused
from souk.clients.workers import WorkerClient, WorkerError
from souk.models.api import (
    NONCE_HEADER,
    App,
    AppOrganization,
    CreateAppRequest,
    CreateLeaseRequest,
    CreateMachineRequest,
    Lease,
    ListAppsResponse,
    MetadataPatch,
    MetadataValue,
    OkResponse,
    PublicMachine,
    Strategy,
    UpdateMachineRequest,
    WorkerInfo,
    WorkerLeaseRequest,
)
from souk.models.catalog import AppRow
from souk.models.machine import (
    CreateMachine,
    Machine,
    MachineEvent,
    MachineState,
    MetadataChange,
    StopRequest,
    UpdateMachine,
)
from souk.models.wire import CORDON_KEY
from souk.web import ApiError, Route, read_model, reply

MAX_WAIT = 60
HINTS = 100_000


class Broker:
    """Everything a handler needs. No state of record: only hints of where machines are."""

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
        self.registry = registry
        self.registry_url = registry_url
        self.before_place = before_place
        # machine id -> (app, worker id, address): machines this broker just created, which the
        # catalog may not show for a few milliseconds more.
        self._hints: OrderedDict[str, tuple[str, str, str]] = OrderedDict()

    # --- finding things ------------------------------------------------------------------

    def app_row(self, name: str) -> AppRow | None:
        row = self.fleet.app(name)
        if row is None and self.registry is not None:
            row = self.registry.get(name)
        return row if row is not None and not row.deleted else None

    def require_app(self, name: str) -> AppRow:
        row = self.app_row(name)
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


def passthrough(exc: WorkerError) -> ApiError:
    """A worker's error, as the public API states it."""
    if exc.http_status == 0:
        return ApiError(503, "worker_unreachable", str(exc))
    return ApiError(exc.http_status, exc.reason, exc.message, exc.details or None)


def public(machine: Machine, nonce: str | None = None) -> PublicMachine:
    return PublicMachine(**machine.model_dump(), nonce=nonce)


def _bool(request: web.Request, name: str) -> bool:
    value = request.query.get(name, "false").lower()
    if value not in ("1", "true", "0", "false", ""):
        raise ApiError(400, "invalid", f"{name}: true or false")
    return value in ("1", "true")


def routes(b: Broker) -> list[Route]:
    def ids(request: web.Request) -> tuple[str, str]:
        return request.match_info["app"], request.match_info["id"]

    def nonce(request: web.Request) -> str | None:
        return request.headers.get(NONCE_HEADER) or None

    async def call(
        app: str,
        mid: str,
        method: str,
        path: str,
        body: Any = None,
        params: dict[str, str] | None = None,
        nonce: str | None = None,
    ) -> Machine:
        worker, address = b.locate(app, mid)
        try:
            return await b.client.action(
                worker, address, method, f"/v1/machines/{mid}{path}", body, params, nonce
            )
        except WorkerError as exc:
            raise passthrough(exc) from exc

    async def get_machine(app: str, mid: str) -> Machine:
        machine = await call(app, mid, "GET", "")
        if machine.app != app:
            raise ApiError(404, "not_found", f"machine {mid} not found in app {app}")
        return machine

    # --- apps --------------------------------------------------------------------------

    def app_view(row: AppRow) -> App:
        count = sum(1 for m in b.fleet.machines(app=row.name) if m.state != "destroyed")
        return App(
            id=row.name,
            name=row.name,
            created_at=row.created_at,
            machine_count=count,
            organization=AppOrganization(slug=row.org, name=row.org),
        )

    async def list_apps(request: web.Request) -> web.Response:
        grant = grant_of(request)
        org = request.query.get("org_slug")
        rows = {r.name: r for r in b.fleet.apps() if not r.deleted}
        if b.registry is not None:
            rows.update({r.name: r for r in b.registry.list()})
        apps = [
            app_view(r)
            for r in sorted(rows.values(), key=lambda r: r.name)
            if grant.allows(r.name, write=False) and org in (None, r.org)
        ]
        return reply(ListAppsResponse(total_apps=len(apps), apps=apps))

    async def forward_registry(
        request: web.Request, method: str, path: str, body: Any = None
    ) -> web.Response:
        if not b.registry_url:
            raise ApiError(503, "no_app_registry", "this broker has no app registry configured")
        headers = {"Authorization": request.headers.get("Authorization", "")}
        try:
            async with b.client.session.request(
                method, b.registry_url + path, json=body, headers=headers
            ) as resp:
                return web.Response(
                    body=await resp.read(), status=resp.status, content_type="application/json"
                )
        except aiohttp.ClientError as exc:
            raise ApiError(
                503, "no_app_registry", f"the app registry is unreachable: {exc}"
            ) from exc

    async def create_app(request: web.Request) -> web.Response:
        body = await read_model(request, CreateAppRequest)
        if not grant_of(request).allows(body.name, write=True):
            raise ApiError(403, "forbidden", grant_of(request).why_not(body.name, True))
        if b.registry is None:
            return await forward_registry(request, "POST", "/v1/apps", body.model_dump())
        try:
            row = b.registry.create(body.name, body.org_slug)
        except AppExists:
            raise ApiError(409, "already_exists", f"app {body.name} already exists") from None
        return reply(app_view(row), status=201)

    async def get_app(request: web.Request) -> web.Response:
        return reply(app_view(b.require_app(request.match_info["app"])))

    async def delete_app(request: web.Request) -> web.Response:
        name = request.match_info["app"]
        b.require_app(name)
        live = [m.id for m in b.fleet.machines(app=name) if m.state != "destroyed"]
        if live:
            raise ApiError(
                409,
                "has_machines",
                f"app {name} still has {len(live)} machines; destroy them first",
                {"machines": live[:20]},
            )
        if b.registry is None:
            return await forward_registry(request, "DELETE", f"/v1/apps/{name}")
        b.registry.delete(name)
        return web.Response(status=202)

    # --- app metadata: kept by the app registry, its one writer ------------------------

    async def get_app_metadata(request: web.Request) -> web.Response:
        name = request.match_info["app"]
        if b.registry is not None:
            try:
                return reply(b.registry.metadata(name))
            except AppNotFound:
                raise ApiError(404, "not_found", f"app {name} not found") from None
        if b.registry_url:  # read from the writer: a deploy reads what it just wrote
            return await forward_registry(request, "GET", f"/v1/apps/{name}/metadata")
        return reply(dict(b.require_app(name).metadata))

    async def patch_app_metadata(request: web.Request) -> web.Response:
        name = request.match_info["app"]
        body = await read_model(request, MetadataChange)
        if b.registry is None:
            path = f"/v1/apps/{name}/metadata"
            return await forward_registry(request, "PATCH", path, body.model_dump())
        try:
            return reply(b.registry.patch_metadata(name, body.set, body.delete))
        except AppNotFound:
            raise ApiError(404, "not_found", f"app {name} not found") from None
        except MetadataRefused as exc:
            raise ApiError(exc.status, exc.code, exc.message) from None

    # --- machines ----------------------------------------------------------------------

    async def list_machines(request: web.Request) -> web.Response:
        app = request.match_info["app"]
        b.require_app(app)
        region = request.query.get("region") or None
        states = {s for s in request.query.get("state", "").split(",") if s}
        unknown = states - set(get_args(MachineState))
        if unknown:
            raise ApiError(400, "invalid", f"state: unknown state {sorted(unknown)[0]!r}")
        include = _bool(request, "include_deleted")
        meta = {
            k[len("metadata.") :]: v for k, v in request.query.items() if k.startswith("metadata.")
        }
        workers = b.app_workers(app, region)
        results = await asyncio.gather(
            *(b.client.machines(w, a, app, include) for w, a in workers.items()),
            return_exceptions=True,
        )
        out: list[PublicMachine] = []
        for result in results:
            if isinstance(result, BaseException):
                continue  # an unreachable worker: its machines show up again when it does
            for m in result:
                if region and m.region != region:
                    continue
                if states and m.state not in states:
                    continue
                if any(m.config.metadata.get(k) != v for k, v in meta.items()):
                    continue
                out.append(public(m))
        out.sort(key=lambda m: (m.created_at, m.id))
        return reply(out)

    def parse_strategy(request: web.Request) -> Strategy:
        strategy = request.query.get("strategy", "auto")
        if strategy not in get_args(Strategy):
            raise ApiError(400, "invalid", "strategy: auto, offers, p2c or catalog")
        return cast(Strategy, strategy)

    async def create_machine(request: web.Request) -> web.Response:
        app = request.match_info["app"]
        body = await read_model(request, CreateMachineRequest)
        strategy = parse_strategy(request)
        policy_name = request.query.get("policy")
        if policy_name is not None and policy_name not in POLICIES:
            raise ApiError(400, "invalid", f"policy: one of {', '.join(POLICIES)}")
        b.require_app(app)
        if b.before_place is not None:
            await b.before_place()
        create = CreateMachine(
            app=app, config=body.config, name=body.name, start=not body.skip_launch
        )
        try:
            machine = await b.placer.place(
                body.region,
                create,
                strategy,
                POLICIES[policy_name] if policy_name else None,
                avoid=frozenset(body.avoid_workers),
            )
        except NoCapacity as exc:
            if exc.asked == 0:  # not a worker in the region, reachable or not
                raise ApiError(
                    400, "invalid", f"region: no region {body.region!r} in this cluster"
                ) from None
            raise ApiError(
                412,
                "insufficient_capacity",
                exc.message(),
                {
                    "region": exc.region,
                    "workers_asked": exc.asked,
                    "refusals": [r.model_dump() for r in exc.refusals],
                },
            ) from None
        except WorkerError as exc:
            raise passthrough(exc) from exc
        worker = b.fleet.worker(machine.worker)
        address = worker.address if worker else ""
        if not address:
            for row in b.fleet.workers(region=body.region, reachable_only=False):
                if row.id == machine.worker:
                    address = row.address
        b.hint(machine, address)
        lease_nonce = None
        if body.lease_ttl:
            lease = WorkerLeaseRequest(ttl=body.lease_ttl, owner=grant_of(request).token_id)
            lease_nonce = (await lease_call(app, machine.id, "POST", lease)).nonce
        return reply(public(machine, lease_nonce))

    async def get(request: web.Request) -> web.Response:
        return reply(public(await get_machine(*ids(request))))

    async def update(request: web.Request) -> web.Response:
        app, mid = ids(request)
        body = await read_model(request, UpdateMachineRequest)
        current = await get_machine(app, mid)
        if body.region is not None and body.region != current.region:
            raise ApiError(
                400,
                "invalid",
                f"region: machine {mid} is in {current.region};"
                " souk does not move machines between regions",
            )
        if body.current_version is not None and body.current_version != current.instance_id:
            raise ApiError(
                412, "precondition_failed", f"current_version: machine is at {current.instance_id}"
            )
        try:
            machine = await call(
                app,
                mid,
                "PUT",
                "",
                UpdateMachine(config=body.config, start=False if body.skip_launch else None),
                nonce=nonce(request),
            )
        except ApiError as exc:
            if exc.http_status == 412:
                details = {
                    **(exc.details or {}),
                    "region": current.region,
                    "worker": current.worker,
                }
                raise ApiError(
                    412,
                    "insufficient_capacity",
                    f"{exc.message} (updates happen in place, on the same worker)",
                    details,
                ) from None
            raise
        return reply(public(machine))

    async def destroy(request: web.Request) -> web.Response:
        app, mid = ids(request)
        params = {"force": "true"} if _bool(request, "force") else None
        return reply(public(await call(app, mid, "DELETE", "", None, params, nonce(request))))

    async def start(request: web.Request) -> web.Response:
        app, mid = ids(request)
        return reply(public(await call(app, mid, "POST", "/start", nonce=nonce(request))))

    async def stop(request: web.Request) -> web.Response:
        app, mid = ids(request)
        body = await read_model(request, StopRequest)
        return reply(public(await call(app, mid, "POST", "/stop", body, nonce=nonce(request))))

    async def restart(request: web.Request) -> web.Response:
        app, mid = ids(request)
        return reply(public(await call(app, mid, "POST", "/restart", nonce=nonce(request))))

    async def wait(request: web.Request) -> web.Response:
        app, mid = ids(request)
        state = request.query.get("state", "started")
        if state not in get_args(MachineState):
            raise ApiError(400, "invalid", f"state: unknown state {state!r}")
        try:
            timeout = float(request.query.get("timeout", str(MAX_WAIT)))
        except ValueError:
            raise ApiError(400, "invalid", "timeout: a number of seconds") from None
        if not 0 <= timeout <= MAX_WAIT:
            raise ApiError(400, "invalid", f"timeout: between 0 and {MAX_WAIT} seconds")
        params = {"state": state, "timeout": f"{timeout:g}"}
        if request.query.get("instance_id"):
            params["instance_id"] = request.query["instance_id"]
        worker, address = b.locate(app, mid)
        try:
            ok, result = await b.client.wait(worker, address, mid, params, timeout)
        except WorkerError as exc:
            raise passthrough(exc) from exc
        if ok:
            return reply(OkResponse())
        return web.json_response(
            {
                "error": f"machine {mid} did not reach {state} within {timeout:g}s",
                "status": "timeout",
                "state": result.state,
                "instance_id": result.instance_id,
            },
            status=408,
        )

    async def events(request: web.Request) -> web.Response:
        app, mid = ids(request)
        await get_machine(app, mid)
        worker, address = b.locate(app, mid)
        try:
            return reply(await b.client.events(worker, address, mid))
        except WorkerError as exc:
            raise passthrough(exc) from exc

    async def logs(request: web.Request) -> web.StreamResponse:
        app, mid = ids(request)
        await get_machine(app, mid)
        _worker, address = b.locate(app, mid)
        params = {k: v for k, v in request.query.items() if k in ("stream", "follow")}
        upstream = await b.client.session.get(
            f"{address}/v1/machines/{mid}/logs",
            params=params,
            timeout=aiohttp.ClientTimeout(total=None, sock_connect=5),
        )
        try:
            if upstream.status != 200:
                raise ApiError(upstream.status, "error", (await upstream.text())[:500])
            response = web.StreamResponse(headers={"Content-Type": "text/plain"})
            await response.prepare(request)
            async for chunk in upstream.content.iter_any():
                await response.write(chunk)
            return response
        finally:
            upstream.release()

    # --- metadata and machine cordon -----------------------------------------------------

    async def set_metadata(
        request: web.Request, changes: dict[str, str | None], version: str | None = None
    ) -> Machine:
        """In place on the worker: same instance, no restart, checked against the lease there."""
        app, mid = ids(request)
        if version is not None:
            current = await get_machine(app, mid)
            if version != current.instance_id:
                raise ApiError(
                    412,
                    "precondition_failed",
                    f"machine_version: machine is at {current.instance_id}",
                )
        patch = MetadataChange(
            set={k: v for k, v in changes.items() if v},
            delete=[k for k, v in changes.items() if not v],
        )
        return await call(app, mid, "PATCH", "/metadata", patch, nonce=nonce(request))

    async def get_metadata(request: web.Request) -> web.Response:
        return reply((await get_machine(*ids(request))).config.metadata)

    async def patch_metadata(request: web.Request) -> web.Response:
        body = await read_model(request, MetadataPatch)
        await set_metadata(request, body.metadata, body.machine_version)
        return web.Response(status=204)

    async def put_metadata_key(request: web.Request) -> web.Response:
        body = await read_model(request, MetadataValue)
        await set_metadata(request, {request.match_info["key"]: body.value})
        return web.Response(status=204)

    async def delete_metadata_key(request: web.Request) -> web.Response:
        await set_metadata(request, {request.match_info["key"]: None})
        return web.Response(status=204)

    async def cordon_machine(request: web.Request) -> web.Response:
        await set_metadata(request, {CORDON_KEY: "true"})
        return reply(OkResponse())

    async def uncordon_machine(request: web.Request) -> web.Response:
        await set_metadata(request, {CORDON_KEY: None})
        return reply(OkResponse())

    # --- leases: kept by the worker holding the machine, its only writer ----------------

    async def lease_call(
        app: str, mid: str, method: str, body: Any = None, lease_nonce: str | None = None
    ) -> Lease:
        worker, address = b.locate(app, mid)
        try:
            data = await b.client.request(
                worker, address, method, f"/v1/machines/{mid}/lease", body, nonce=lease_nonce
            )
        except WorkerError as exc:
            raise passthrough(exc) from exc
        return Lease.model_validate(data)

    async def get_lease(request: web.Request) -> web.Response:
        app, mid = ids(request)
        await get_machine(app, mid)
        return reply(await lease_call(app, mid, "GET"))

    async def create_lease(request: web.Request) -> web.Response:
        app, mid = ids(request)
        body = await read_model(request, CreateLeaseRequest)
        await get_machine(app, mid)
        ask = WorkerLeaseRequest(
            ttl=body.ttl, description=body.description, owner=grant_of(request).token_id
        )
        return reply(await lease_call(app, mid, "POST", ask, nonce(request)))

    async def release_lease(request: web.Request) -> web.Response:
        app, mid = ids(request)
        await get_machine(app, mid)
        worker, address = b.locate(app, mid)
        try:
            await b.client.request(
                worker, address, "DELETE", f"/v1/machines/{mid}/lease", nonce=nonce(request)
            )
        except WorkerError as exc:
            raise passthrough(exc) from exc
        return reply(OkResponse())

    # --- the fleet (operators) ---------------------------------------------------------

    def require_operator(request: web.Request) -> None:
        if not grant_of(request).operator:
            raise ApiError(403, "forbidden", "fleet operations need an operator token")

    async def list_workers(request: web.Request) -> web.Response:
        require_operator(request)
        region = request.query.get("region") or None
        reachable = {w.id for w in b.fleet.workers(region=region, reachable_only=True)}
        rows = sorted(
            b.fleet.workers(region=region, reachable_only=False), key=lambda w: (w.region, w.id)
        )
        return reply(
            [
                WorkerInfo(
                    id=w.id,
                    region=w.region,
                    address=w.address,
                    cpus_total=w.cpus_total,
                    cpus_free=w.cpus_free,
                    memory_mb_total=w.memory_mb_total,
                    memory_mb_free=w.memory_mb_free,
                    machines=w.machines,
                    cordoned=w.cordoned,
                    reachable=w.id in reachable,
                )
                for w in rows
            ]
        )

    async def cordon_worker(request: web.Request) -> web.Response:
        require_operator(request)
        wid = request.match_info["worker"]
        worker = b.fleet.worker(wid)
        if worker is None:
            raise ApiError(404, "not_found", f"worker {wid} not found")
        path = "/v1/cordon" if request.path.endswith("/cordon") else "/v1/uncordon"
        try:
            return reply(await b.client.request(wid, worker.address, "POST", path))
        except WorkerError as exc:
            raise passthrough(exc) from exc

    m = "/v1/apps/{app}/machines/{id}"
    meta = m + "/metadata"
    ok_lease = (404, 409)
    return [
        Route(
            "GET",
            "/v1/apps",
            list_apps,
            "List apps",
            response=ListAppsResponse,
            query={"org_slug": "only this organisation's"},
        ),
        Route(
            "POST",
            "/v1/apps",
            create_app,
            "Create an app",
            CreateAppRequest,
            App,
            201,
            errors=(403, 409, 503),
        ),
        Route("GET", "/v1/apps/{app}", get_app, "An app", response=App, errors=(404,)),
        Route(
            "DELETE",
            "/v1/apps/{app}",
            delete_app,
            "Delete an app with no machines",
            status=202,
            errors=(404, 409),
        ),
        Route(
            "GET",
            "/v1/apps/{app}/metadata",
            get_app_metadata,
            "The app's metadata (souk extension)",
            response=dict[str, str],
            errors=(404, 503),
        ),
        Route(
            "PATCH",
            "/v1/apps/{app}/metadata",
            patch_app_metadata,
            "Delete, then set, app metadata keys in one step; answers with the result",
            MetadataChange,
            dict[str, str],
            errors=(400, 404, 413, 503),
        ),
        Route(
            "GET",
            "/v1/apps/{app}/machines",
            list_machines,
            "List an app's machines",
            response=list[PublicMachine],
            errors=(404,),
            query={
                "region": "only this region",
                "state": "comma-separated states",
                "include_deleted": "also destroyed machines",
                "metadata.KEY": "only machines whose metadata KEY has this value",
            },
        ),
        Route(
            "POST",
            "/v1/apps/{app}/machines",
            create_machine,
            "Create a machine in one region: placed immediately, or 412",
            CreateMachineRequest,
            PublicMachine,
            errors=(404, 412),
            query={
                "strategy": "auto (default: offers in a small region, catalog in a big one),"
                " offers, p2c or catalog",
                "policy": "default, binpack or spread",
            },
        ),
        Route("GET", m, get, "A machine", response=PublicMachine, errors=(404,)),
        Route(
            "POST",
            m,
            update,
            "Update: new config and instance id, in place",
            UpdateMachineRequest,
            PublicMachine,
            errors=(404, 409, 412),
        ),
        Route(
            "DELETE",
            m,
            destroy,
            "Destroy",
            response=PublicMachine,
            errors=(404, 409),
            query={"force": "even if it is running"},
        ),
        Route("POST", m + "/start", start, "Start", response=PublicMachine, errors=(404, 409)),
        Route(
            "POST",
            m + "/stop",
            stop,
            "Stop: signal, then kill after the timeout",
            StopRequest,
            PublicMachine,
            errors=(404, 409),
        ),
        Route(
            "POST", m + "/restart", restart, "Restart", response=PublicMachine, errors=(404, 409)
        ),
        Route(
            "GET",
            m + "/wait",
            wait,
            "Wait for a state; 408 with the current state",
            response=OkResponse,
            errors=(404, 408),
            query={
                "state": "default started",
                "timeout": "seconds, at most 60",
                "instance_id": "only this version",
            },
        ),
        Route(
            "GET",
            m + "/events",
            events,
            "The machine's events",
            response=list[MachineEvent],
            errors=(404,),
        ),
        Route(
            "GET",
            m + "/logs",
            logs,
            "stdout or stderr (souk extension)",
            errors=(404,),
            query={"stream": "stdout or stderr", "follow": "keep streaming"},
        ),
        Route(
            "POST",
            m + "/cordon",
            cordon_machine,
            "Take out of the proxy's rotation",
            response=OkResponse,
            errors=(404, 409),
        ),
        Route(
            "POST",
            m + "/uncordon",
            uncordon_machine,
            "Back into the proxy's rotation",
            response=OkResponse,
            errors=(404, 409),
        ),
        Route("GET", meta, get_metadata, "Metadata", response=dict[str, str], errors=(404,)),
        Route(
            "PATCH",
            meta,
            patch_metadata,
            "Set or remove several keys",
            MetadataPatch,
            status=204,
            errors=(404, 409, 412),
        ),
        Route(
            "POST",
            meta + "/{key}",
            put_metadata_key,
            "Set one key",
            MetadataValue,
            status=204,
            errors=(404, 409),
        ),
        Route(
            "DELETE",
            meta + "/{key}",
            delete_metadata_key,
            "Remove one key",
            status=204,
            errors=(404, 409),
        ),
        Route("GET", m + "/lease", get_lease, "The current lease", response=Lease, errors=(404,)),
        Route(
            "POST",
            m + "/lease",
            create_lease,
            "Take or refresh a lease",
            CreateLeaseRequest,
            Lease,
            errors=ok_lease,
        ),
        Route(
            "DELETE",
            m + "/lease",
            release_lease,
            "Release a lease",
            response=OkResponse,
            errors=ok_lease,
        ),
        Route(
            "GET",
            "/v1/workers",
            list_workers,
            "Workers (operator tokens only)",
            response=list[WorkerInfo],
            errors=(403,),
            query={"region": "only this region"},
        ),
        Route(
            "POST",
            "/v1/workers/{worker}/cordon",
            cordon_worker,
            "Cordon a worker: no new machines (operator)",
            errors=(403, 404),
        ),
        Route(
            "POST",
            "/v1/workers/{worker}/uncordon",
            cordon_worker,
            "Uncordon a worker (operator)",
            errors=(403, 404),
        ),
    ]
