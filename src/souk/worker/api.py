"""The worker's internal HTTP API: what brokers and the CLI call."""

from __future__ import annotations

import asyncio
import functools
import logging
from dataclasses import replace
from typing import cast, get_args

from aiohttp import web

from souk import listeners
from souk.models.api import (
    HOLD_HEADER,
    NONCE_HEADER,
    ConfirmationResult,
    Confirmations,
    CreateBatch,
    CreateOutcome,
    CreateOutcomes,
    Lease,
    PinImageRequest,
    PinnedImage,
    WorkerLeaseRequest,
)
from souk.models.capacity import Capacity, Offer, OfferRequest
from souk.models.machine import (
    CreateMachine,
    Machine,
    MachineEvent,
    MachineState,
    MetadataChange,
    StopRequest,
    UpdateMachine,
    WaitResult,
)
from souk.models.machine_ops import (
    ExecRequest,
    ExecResponse,
    MachineVersion,
    ProcessStat,
    SignalRequest,
    SocketHolder,
)
from souk.models.volume import (
    CreateVolume,
    ExtendVolumeRequest,
    ExtendVolumeResponse,
    UpdateVolumeRequest,
    Volume,
    VolumeSnapshot,
)
from souk.pki import AccessTable
from souk.web import ApiError, Number, Route, number, read_model, reply
from souk.web.errors import error_body
from souk.web.metrics import METRICS_PATH, serve_metrics
from souk.web.routes import Handler
from souk.worker import logs, pinning, ps
from souk.worker.admission import Fences
from souk.worker.engine import Engine
from souk.worker.errors import (
    AlreadyExists,
    Conflict,
    InvalidImage,
    MetadataTooLarge,
    NoRoom,
    NotFound,
    RegistryUnavailable,
    StorageFault,
    StorageFull,
    TimedOut,
    WorkerError,
)
from souk.worker.holds import MAX_HOLD
from souk.worker.status import WorkerStatus

log = logging.getLogger("souk.worker")

MAX_WAIT = 60.0
# How long a create with `start: true` may wait to answer with its machine started (or failed):
# well within the share of its deadline a broker gives one worker.
CREATE_WAIT = 0.5

# The one place a worker's refusal becomes an HTTP status; the most specific class listed wins.
HTTP_STATUS: dict[type[WorkerError], int] = {
    InvalidImage: 400,
    NotFound: 404,
    Conflict: 409,
    TimedOut: 408,
    NoRoom: 412,
    MetadataTooLarge: 413,
    StorageFault: 503,
    StorageFull: 507,
    RegistryUnavailable: 502,
}
WRITE_ERRORS = (503, 507)  # any request that records something may meet a full disk


def http_error(exc: WorkerError) -> ApiError:
    status = next((HTTP_STATUS[c] for c in type(exc).__mro__ if c in HTTP_STATUS), 500)
    return ApiError(status, exc.reason, exc.message, exc.details)


def _answering(handler: Handler) -> Handler:
    @functools.wraps(handler)
    async def answer(request: web.Request) -> web.StreamResponse:
        try:
            return await handler(request)
        except WorkerError as exc:
            raise http_error(exc) from exc

    return answer


# Who may call each route of `_routes` over mutual TLS, by the role in the caller's certificate
# (docs/security.md). Brokers place and run machines; operators may do everything. A proxy gets
# nothing but one question: whether a machine holds the socket it is about to send a request
# to. A route left out is closed to every role.
_BROKERS = ("broker", "operator")
_M = "/v1/machines/{id}"
_V = "/v1/volumes/{id}"
ACCESS = AccessTable(
    {
        "GET /v1/capacity": _BROKERS,
        "GET /v1/status": _BROKERS,
        "POST /v1/offers": _BROKERS,
        "POST /v1/images/pin": _BROKERS,
        "POST /v1/machines": _BROKERS,
        "POST /v1/machines/batch": _BROKERS,
        "POST /v1/confirmations": _BROKERS,
        "GET /v1/machines": _BROKERS,
        f"GET {_M}": _BROKERS,
        f"PUT {_M}": _BROKERS,
        f"PATCH {_M}/metadata": _BROKERS,
        f"GET {_M}/lease": _BROKERS,
        f"POST {_M}/lease": _BROKERS,
        f"DELETE {_M}/lease": _BROKERS,
        f"POST {_M}/start": _BROKERS,
        f"POST {_M}/stop": _BROKERS,
        f"POST {_M}/restart": _BROKERS,
        f"POST {_M}/suspend": _BROKERS,
        f"POST {_M}/signal": _BROKERS,
        f"POST {_M}/exec": _BROKERS,
        f"GET {_M}/ps": _BROKERS,
        f"GET {_M}/sockets/{{inode}}": (*_BROKERS, "proxy"),
        f"GET {_M}/versions": _BROKERS,
        f"DELETE {_M}": _BROKERS,
        f"GET {_M}/wait": _BROKERS,
        f"GET {_M}/events": _BROKERS,
        f"GET {_M}/logs": _BROKERS,
        "GET /v1/volumes": _BROKERS,
        "POST /v1/volumes": _BROKERS,
        f"GET {_V}": _BROKERS,
        f"PUT {_V}": _BROKERS,
        f"DELETE {_V}": _BROKERS,
        f"PUT {_V}/extend": _BROKERS,
        f"GET {_V}/snapshots": _BROKERS,
        f"POST {_V}/snapshots": _BROKERS,
        "POST /v1/cordon": _BROKERS,  # a broker forwards an operator token's request
        "POST /v1/uncordon": _BROKERS,
        "GET /openapi.json": _BROKERS,
        # Prometheus shows an operator certificate; the numbers name no machine, but they tell
        # how busy the host is, which is nobody else's business.
        "GET /metrics": ("operator",),
    }
)


def routes(engine: Engine) -> list[Route]:
    """The route table, each handler's refusals answered through HTTP_STATUS."""
    return [replace(route, handler=_answering(route.handler)) for route in _routes(engine)]


def _routes(engine: Engine) -> list[Route]:
    def machine_id(request: web.Request) -> str:
        return request.match_info["id"]

    async def capacity(_: web.Request) -> web.Response:
        return reply(engine.capacity())

    async def status(_: web.Request) -> web.Response:
        return reply(engine.status())

    async def offer(request: web.Request) -> web.Response:
        return reply(engine.offer(await read_model(request, OfferRequest)))

    async def pin_image(request: web.Request) -> web.Response:
        body = await read_model(request, PinImageRequest)
        return reply(await pinning.pin(engine.drivers, engine.settings.name, body.image))

    fences = Fences()

    def fenced(machine_id: str) -> AlreadyExists:
        return AlreadyExists(
            f"machine {machine_id} was destroyed by a broker that lost its create's answer:"
            " this create came too late"
        )

    def hold(request: web.Request) -> float | None:
        raw = request.headers.get(HOLD_HEADER)
        if raw is None:
            return None
        try:
            seconds = float(raw)
        except ValueError:
            seconds = -1.0
        if not 0 < seconds <= MAX_HOLD:
            raise ApiError(400, "invalid", f"{HOLD_HEADER}: seconds, above 0, at most {MAX_HOLD:g}")
        return seconds

    async def create_one(body: CreateMachine, seconds: float | None) -> Machine:
        if fences.holds(body.id):
            raise fenced(body.id or "")
        machine = await engine.create(body, seconds, wait=CREATE_WAIT)
        if fences.holds(machine.id):  # fenced while it was being recorded
            await engine.submit(machine.id, "destroy", {"force": True})
            raise fenced(machine.id)
        return machine

    async def create(request: web.Request) -> web.Response:
        body = await read_model(request, CreateMachine)
        return reply(await create_one(body, hold(request)), status=201)

    async def create_batch(request: web.Request) -> web.Response:
        body = await read_model(request, CreateBatch)
        seconds = hold(request)

        async def outcome(create: CreateMachine) -> CreateOutcome:
            try:
                return CreateOutcome(status=201, machine=await create_one(create, seconds))
            except WorkerError as exc:
                err = http_error(exc)
            except Exception:  # one create's fault is its own 500, as it would be alone
                log.exception("create %s of a batch failed", create.id)
                err = ApiError(500, "internal_error", "internal error; see the server's log")
            error = error_body(err.reason, err.message, err.details)
            return CreateOutcome(status=err.http_status, error=error)

        async def confirmed() -> dict[str, str]:
            if not body.confirm:
                return {}
            try:
                return await engine.confirm(body.confirm)
            except Exception:  # the ids are missing from the answer: sent again
                log.exception("confirmations riding with a batch failed")
                return {}

        # at once, so that the store commits them together
        *outcomes, holds = await asyncio.gather(*map(outcome, body.machines), confirmed())
        return reply(CreateOutcomes.model_validate({"outcomes": outcomes, "holds": holds}))

    async def confirm(request: web.Request) -> web.Response:
        body = await read_model(request, Confirmations)
        return reply(ConfirmationResult.model_validate({"holds": await engine.confirm(body.ids)}))

    async def list_machines(request: web.Request) -> web.Response:
        include = request.query.get("include_deleted", "") in ("1", "true")
        return reply(engine.machines(request.query.get("app"), include_destroyed=include))

    async def get(request: web.Request) -> web.Response:
        return reply(engine.get(machine_id(request)))

    def nonce(request: web.Request) -> str | None:
        return request.headers.get(NONCE_HEADER)

    async def update(request: web.Request) -> web.Response:
        body = await read_model(request, UpdateMachine)
        mid = machine_id(request)
        update = engine.update(mid, body.config, body.start, nonce(request), body.secrets)
        return reply(await update)

    async def patch_metadata(request: web.Request) -> web.Response:
        body = await read_model(request, MetadataChange)
        return reply(await engine.patch_metadata(machine_id(request), body, nonce(request)))

    async def start(request: web.Request) -> web.Response:
        return reply(await engine.submit(machine_id(request), "start", nonce=nonce(request)))

    async def stop(request: web.Request) -> web.Response:
        body = await read_model(request, StopRequest)
        params = body.model_dump(exclude_none=True)
        return reply(await engine.submit(machine_id(request), "stop", params, nonce(request)))

    async def restart(request: web.Request) -> web.Response:
        return reply(await engine.submit(machine_id(request), "restart", nonce=nonce(request)))

    async def suspend(request: web.Request) -> web.Response:
        return reply(await engine.submit(machine_id(request), "suspend", nonce=nonce(request)))

    async def signal(request: web.Request) -> web.Response:
        body = await read_model(request, SignalRequest)
        await engine.signal(machine_id(request), body.signal, nonce(request))
        return reply({"ok": True})

    async def exec_command(request: web.Request) -> web.Response:
        body = await read_model(request, ExecRequest)
        result = await engine.exec(machine_id(request), body)
        return reply(result.model_dump(exclude_none=True))  # exit_signal only when one

    async def processes(request: web.Request) -> web.Response:
        sort_by = request.query.get("sort_by") or "pid"
        order = request.query.get("order") or "asc"
        if sort_by not in ps.SORT_KEYS:
            raise ApiError(400, "invalid", f"sort_by: one of {', '.join(ps.SORT_KEYS)}")
        if order not in ("asc", "desc"):
            raise ApiError(400, "invalid", "order: asc or desc")
        return reply(await engine.processes(machine_id(request), sort_by, order))

    async def socket_holder(request: web.Request) -> web.Response:
        raw = request.match_info["inode"]
        if not raw.isdigit() or len(raw) > 20:
            raise ApiError(400, "invalid", f"inode: a socket's inode number, not {raw[:40]!r}")
        inode = int(raw)
        pids = await engine.pids(machine_id(request))
        held = await asyncio.to_thread(listeners.holds, pids, inode)
        return reply(SocketHolder(inode=inode, held=held))

    async def versions(request: web.Request) -> web.Response:
        return reply(engine.versions(machine_id(request)))

    async def destroy(request: web.Request) -> web.Response:
        force = request.query.get("force", "") in ("1", "true")
        if request.query.get("fence", "") in ("1", "true"):
            fences.fence(machine_id(request))
        params = {"force": force}
        return reply(await engine.submit(machine_id(request), "destroy", params, nonce(request)))

    async def get_lease(request: web.Request) -> web.Response:
        lease = engine.lease(machine_id(request))
        if lease is None:
            raise ApiError(404, "not_found", f"machine {machine_id(request)} has no lease")
        return reply(lease)

    async def acquire_lease(request: web.Request) -> web.Response:
        body = await read_model(request, WorkerLeaseRequest)
        lease = await engine.acquire_lease(
            machine_id(request), body.ttl, body.description, body.owner, nonce(request)
        )
        return reply(lease)

    async def release_lease(request: web.Request) -> web.Response:
        await engine.release_lease(machine_id(request), nonce(request))
        return reply({"ok": True})

    async def wait(request: web.Request) -> web.Response:
        state = request.query.get("state", "started")
        if state not in get_args(MachineState):
            raise ApiError(400, "invalid", f"state: unknown state {state!r}")
        timeout = number(request, "timeout", 10.0)
        ok, machine = await engine.wait(
            machine_id(request),
            cast(MachineState, state),
            timeout,
            request.query.get("instance_id"),
        )
        result = WaitResult(ok=ok, state=machine.state, instance_id=machine.instance_id)
        if ok:
            return reply(result)
        # an error like any other (as documented), that still says where the machine is
        message = f"machine {machine.id} did not reach {state} within {timeout:g}s"
        body = error_body("timeout", message).model_dump(exclude_none=True)
        return reply({**body, **result.model_dump(mode="json")}, status=408)

    async def events(request: web.Request) -> web.Response:
        engine.get(machine_id(request), events=False)
        return reply(engine.events(machine_id(request)))

    async def get_logs(request: web.Request) -> web.StreamResponse:
        mid = machine_id(request)
        engine.get(mid, events=False)
        stream = request.query.get("stream", "stdout")
        if stream not in logs.STREAMS:
            raise ApiError(400, "invalid", "stream: stdout or stderr")
        rundir = engine.settings.rundir(mid)
        tail = logs.read_tail(rundir, stream, engine.settings.log_max_bytes)
        if request.query.get("follow", "") not in ("1", "true"):
            return web.Response(body=tail, content_type="text/plain")
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        await response.write(tail)
        async for chunk in logs.follow(rundir, stream):
            await response.write(chunk)
        return response

    async def cordon(_: web.Request) -> web.Response:
        await engine.set_cordoned(True)
        return reply(engine.capacity())

    async def uncordon(_: web.Request) -> web.Response:
        await engine.set_cordoned(False)
        return reply(engine.capacity())

    async def create_volume(request: web.Request) -> web.Response:
        body = await read_model(request, CreateVolume)
        return reply(await engine.create_volume(body), status=201)

    async def list_volumes(request: web.Request) -> web.Response:
        return reply(engine.list_volumes(request.query.get("app")))

    async def get_volume(request: web.Request) -> web.Response:
        return reply(engine.volume(machine_id(request)))

    async def update_volume(request: web.Request) -> web.Response:
        body = await read_model(request, UpdateVolumeRequest)
        return reply(await engine.update_volume(machine_id(request), body))

    async def destroy_volume(request: web.Request) -> web.Response:
        return reply(await engine.destroy_volume(machine_id(request)))

    async def extend_volume(request: web.Request) -> web.Response:
        body = await read_model(request, ExtendVolumeRequest)
        volume = await engine.extend_volume(machine_id(request), body.wanted_mb())
        return reply(ExtendVolumeResponse(volume=volume, needs_restart=False))

    async def list_snapshots(request: web.Request) -> web.Response:
        return reply(engine.snapshots(machine_id(request)))

    async def create_snapshot(request: web.Request) -> web.Response:
        snapshot_id = await engine.snapshot_volume(machine_id(request))
        made = [s for s in engine.snapshots(machine_id(request)) if s.id == snapshot_id]
        if not made:
            raise ApiError(500, "snapshot_failed", f"snapshot {snapshot_id} was not made")
        return reply(made[0], status=201)

    v = "/v1/volumes/{id}"
    m = "/v1/machines/{id}"
    return [
        Route(
            "POST",
            "/v1/volumes",
            create_volume,
            "Reserve disk and make a volume (or restore a snapshot into a new one)",
            CreateVolume,
            Volume,
            201,
            errors=(409, 412, *WRITE_ERRORS),
        ),
        Route(
            "GET",
            "/v1/volumes",
            list_volumes,
            "List volumes",
            response=list[Volume],
            query={"app": "only this app's"},
        ),
        Route("GET", v, get_volume, "A volume", response=Volume, errors=(404,)),
        Route(
            "PUT",
            v,
            update_volume,
            "Change a volume's snapshot retention",
            UpdateVolumeRequest,
            Volume,
            errors=(404, *WRITE_ERRORS),
        ),
        Route(
            "DELETE",
            v,
            destroy_volume,
            "Destroy a volume and its snapshots; refused while a machine mounts it",
            response=Volume,
            errors=(404, 409, *WRITE_ERRORS),
        ),
        Route(
            "PUT",
            v + "/extend",
            extend_volume,
            "Grow a volume, online",
            ExtendVolumeRequest,
            ExtendVolumeResponse,
            errors=(404, 409, 412, *WRITE_ERRORS),
        ),
        Route(
            "GET",
            v + "/snapshots",
            list_snapshots,
            "A volume's snapshots, oldest first",
            response=list[VolumeSnapshot],
            errors=(404,),
        ),
        Route(
            "POST",
            v + "/snapshots",
            create_snapshot,
            "Take a consistent snapshot (the file system is frozen while it is copied)",
            response=VolumeSnapshot,
            status=201,
            errors=(404, 409, *WRITE_ERRORS),
        ),
        Route("GET", "/v1/capacity", capacity, "Totals, reserved, free", response=Capacity),
        Route(
            "GET",
            "/v1/status",
            status,
            "Whether changes can be recorded now, and whether the catalog's bus is reached",
            response=WorkerStatus,
        ),
        Route("POST", "/v1/offers", offer, "Would this guest fit here now?", OfferRequest, Offer),
        Route(
            "POST",
            "/v1/images/pin",
            pin_image,
            "The image with the digest its tag names now, asked of its registry",
            PinImageRequest,
            PinnedImage,
            errors=(400, 404, 409, 502),
        ),
        Route(
            "POST",
            "/v1/machines",
            create,
            "Reserve and create a machine; with `start`, answered once it runs (or within"
            f" {CREATE_WAIT:g}s)",
            CreateMachine,
            Machine,
            201,
            errors=(409, 412, *WRITE_ERRORS),
        ),
        Route(
            "POST",
            "/v1/machines/batch",
            create_batch,
            "Several creates at once, each reserved and answered (in `outcomes`, in order) as"
            " it would be alone, and the holds in `confirm` ended (in `holds`); recorded"
            " together",
            CreateBatch,
            CreateOutcomes,
        ),
        Route(
            "POST",
            "/v1/confirmations",
            confirm,
            f"End the provisional holds of machines created with {HOLD_HEADER}",
            Confirmations,
            ConfirmationResult,
            errors=WRITE_ERRORS,
        ),
        Route(
            "GET",
            "/v1/machines",
            list_machines,
            "List machines",
            response=list[Machine],
            query={"app": "only this app's", "include_deleted": "also destroyed ones"},
        ),
        Route("GET", m, get, "A machine and its recent events", response=Machine, errors=(404,)),
        Route(
            "PUT",
            m,
            update,
            "Update in place: new config, new instance id",
            UpdateMachine,
            Machine,
            errors=(404, 409, 412, *WRITE_ERRORS),
        ),
        Route(
            "PATCH",
            m + "/metadata",
            patch_metadata,
            "Set and delete metadata keys in place: no restart, same instance",
            MetadataChange,
            Machine,
            errors=(404, 409, 413, *WRITE_ERRORS),
        ),
        Route("GET", m + "/lease", get_lease, "The machine's lease", response=Lease, errors=(404,)),
        Route(
            "POST",
            m + "/lease",
            acquire_lease,
            f"Take a lease, or extend yours (send its nonce in {NONCE_HEADER})",
            WorkerLeaseRequest,
            Lease,
            errors=(404, 409, *WRITE_ERRORS),
        ),
        Route(
            "DELETE",
            m + "/lease",
            release_lease,
            f"Release your lease (its nonce in {NONCE_HEADER})",
            errors=(404, 409, *WRITE_ERRORS),
        ),
        Route(
            "POST",
            m + "/start",
            start,
            "Start",
            response=Machine,
            errors=(404, 409, *WRITE_ERRORS),
        ),
        Route(
            "POST",
            m + "/stop",
            stop,
            "Stop: signal, then SIGKILL after the timeout",
            StopRequest,
            Machine,
            errors=(404, 409, *WRITE_ERRORS),
        ),
        Route(
            "POST",
            m + "/restart",
            restart,
            "Restart",
            response=Machine,
            errors=(404, 409, *WRITE_ERRORS),
        ),
        Route(
            "POST",
            m + "/suspend",
            suspend,
            "Suspend: freeze its processes in memory, keep its reservation; start resumes it",
            response=Machine,
            errors=(404, 409, *WRITE_ERRORS),
        ),
        Route(
            "POST",
            m + "/signal",
            signal,
            f"Send a signal to the machine's main process (a held lease's nonce in {NONCE_HEADER})",
            SignalRequest,
            errors=(404, 409, *WRITE_ERRORS),
        ),
        Route(
            "POST",
            m + "/exec",
            exec_command,
            "Run a command inside the machine; its output and exit code",
            ExecRequest,
            ExecResponse,
            errors=(404, 408, 409),
        ),
        Route(
            "GET",
            m + "/ps",
            processes,
            "The machine's processes",
            response=list[ProcessStat],
            query={"sort_by": f"one of {', '.join(ps.SORT_KEYS)}", "order": "asc or desc"},
            errors=(404,),
        ),
        Route(
            "GET",
            m + "/sockets/{inode}",
            socket_holder,
            "Whether the machine's processes hold this socket (the proxy asks, of what listens at"
            " the machine's address)",
            response=SocketHolder,
            errors=(400, 404),
        ),
        Route(
            "GET",
            m + "/versions",
            versions,
            "Every config the machine has had, newest first",
            response=list[MachineVersion],
            errors=(404,),
        ),
        Route(
            "DELETE",
            m,
            destroy,
            "Destroy and release its reservation",
            response=Machine,
            query={"force": "kill it even if it is running"},
            errors=(404, 409, *WRITE_ERRORS),
        ),
        Route(
            "GET",
            m + "/wait",
            wait,
            "Long-poll until the machine reaches a state",
            response=WaitResult,
            errors=(404, 408),
            query={
                "state": "default started",
                "timeout": Number("seconds, default 10", 0, MAX_WAIT, whole=False),
                "instance_id": "only this instance",
            },
        ),
        Route(
            "GET",
            m + "/events",
            events,
            "The machine's log of operations",
            response=list[MachineEvent],
            errors=(404,),
        ),
        Route(
            "GET",
            m + "/logs",
            get_logs,
            "stdout or stderr; follow=true streams",
            query={"stream": "stdout or stderr", "follow": "keep streaming"},
            errors=(404,),
        ),
        Route(
            "POST",
            "/v1/cordon",
            cordon,
            "Refuse new machines, keep the ones here",
            response=Capacity,
            errors=WRITE_ERRORS,
        ),
        Route(
            "POST",
            "/v1/uncordon",
            uncordon,
            "Accept new machines again",
            response=Capacity,
            errors=WRITE_ERRORS,
        ),
        Route(
            "GET",
            METRICS_PATH,
            serve_metrics(engine.metrics.metrics),
            "Prometheus metrics (text format)",
        ),
    ]
