"""A worker's internal HTTP API, for the broker: one pooled client for every worker, and the
only place the worker's paths are spelled.

Worker errors come back as `WorkerCallError` carrying the worker's own status and body, so the
broker can pass a 404 or a 409 through and turn a 412 into a placement refusal.

Given its node files, the client speaks mutual TLS only: it shows its own certificate and
accepts a worker only if the worker's certificate carries the id it meant to reach, so an
address in the catalog that leads elsewhere gets nothing (`WorkerCallError`, reason `untrusted`).
"""

from __future__ import annotations

import contextlib
import functools
import ssl
from collections.abc import AsyncIterator
from typing import Any, TypedDict, TypeVar, Unpack

import aiohttp
import orjson
from pydantic import BaseModel, TypeAdapter

from souk.clients.http import ClientError, HttpClient, Tls, refusal_of
from souk.models.api import (
    HOLD_HEADER,
    NONCE_HEADER,
    ConfirmationResult,
    Confirmations,
    CreateBatch,
    CreateOutcomes,
    HoldAnswer,
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
    MetadataChange,
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
from souk.models.wire import PROTOCOL, PROTOCOL_HEADER
from souk.pki import NodeFiles, PkiError, reloading_client_context
from souk.pki.identity import check_name

DEFAULT_TIMEOUT = 10.0
VOLUME_TIMEOUT = 70.0  # a worker answers a volume operation once it has run (at most 60 s)
PIN_TIMEOUT = 10.0  # a worker asks the image's registry; a broker asks three at most

T = TypeVar("T")

_MACHINES = TypeAdapter(list[Machine])
_VOLUMES = TypeAdapter(list[Volume])
_SNAPSHOTS = TypeAdapter(list[VolumeSnapshot])
_EVENTS = TypeAdapter(list[MachineEvent])
_PROCESSES = TypeAdapter(list[ProcessStat])
_VERSIONS = TypeAdapter(list[MachineVersion])


class _Options(TypedDict, total=False):
    """What a call may add to its method, path and body (`WorkerClient._request`)."""

    params: dict[str, str] | None
    timeout: float
    nonce: str | None
    accept: tuple[int, ...]
    headers: dict[str, str] | None


class WorkerCallError(ClientError):
    """A worker answered with an error, or could not be reached (`http_status` 0 then)."""

    def __init__(
        self,
        worker: str,
        http_status: int,
        reason: str,
        message: str,
        details: dict[str, Any] | None = None,
    ) -> None:
        super().__init__(http_status, reason, message, details)
        self.worker = worker

    def __str__(self) -> str:
        return f"worker {self.worker}: {self.message}"


def _path(machine_id: str, verb: str = "") -> str:
    return f"/v1/machines/{machine_id}" + (f"/{verb}" if verb else "")


def _volume_path(volume_id: str, verb: str = "") -> str:
    return f"/v1/volumes/{volume_id}" + (f"/{verb}" if verb else "")


def _held(hold: float | None) -> dict[str, str] | None:
    """The header that makes a create provisional for `hold` seconds."""
    return None if hold is None else {HOLD_HEADER: f"{hold:g}"}


def _tls(files: NodeFiles | None) -> Tls | None:
    if files is None:
        return None
    # Another broker's public listener (the app registry's) is reached with the default
    # context: the system's CAs and the cluster's.
    trust = ssl.create_default_context()
    trust.load_verify_locations(cafile=files.ca)
    return Tls(trust=trust, identity=reloading_client_context(files).context, only=True)


def outcomes_of(
    worker: str, answer: CreateOutcomes, sent: int
) -> tuple[list[Machine | WorkerCallError], dict[str, HoldAnswer]]:
    """A batch's answer (over HTTP or the bus) as `WorkerClient.create_batch` returns it."""
    if len(answer.outcomes) != sent:
        message = f"answered {len(answer.outcomes)} outcomes to {sent} creates"
        raise WorkerCallError(worker, 502, "invalid", message)
    results: list[Machine | WorkerCallError] = [
        o.machine
        if o.machine is not None
        else WorkerCallError(
            worker,
            o.status,
            *(refusal_of(o.error) if o.error else ("error", f"status {o.status}", None)),
        )
        for o in answer.outcomes
    ]
    return results, answer.holds


class WorkerClient(HttpClient):
    """Typed calls to any worker, given its id (for errors, and the name its certificate must
    carry) and base URL. With `tls`, the node files of the caller (a broker)."""

    def __init__(
        self,
        session: aiohttp.ClientSession | None = None,
        tls: NodeFiles | None = None,
        per_worker: int = 64,
    ) -> None:
        """`per_worker`: connections held to one worker at most; a request beyond them waits
        for one to be free instead of opening another (and, with TLS, paying a handshake)."""
        version = {PROTOCOL_HEADER: str(PROTOCOL)}  # on every call (souk.web.protocol)
        super().__init__(session, version, limit=0, limit_per_host=per_worker, tls=_tls(tls))

    def _server_name(self, worker: str, base: str) -> str | None:
        """The name the worker's certificate must carry: its id. A caller that knows only the
        address (a static list of URLs) passes it as both, and the URL's host is checked."""
        if worker == base or self.tls.identity is None:
            return None
        try:
            return check_name(worker)
        except PkiError as exc:
            message = f"cannot check worker {worker!r}: {exc}"
            raise WorkerCallError(worker, 0, "untrusted", message) from None

    async def _request(
        self,
        worker: str,
        base: str,
        method: str,
        path: str,
        body: BaseModel | None = None,
        params: dict[str, str] | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        nonce: str | None = None,
        accept: tuple[int, ...] = (),
        headers: dict[str, str] | None = None,
    ) -> Any:
        """The decoded JSON answer of a call (None for an empty one)."""
        if nonce:
            headers = {**(headers or {}), NONCE_HEADER: nonce}
        fail = functools.partial(WorkerCallError, worker)
        url = base + path
        name = self._server_name(worker, base)
        payload = await self.send(fail, method, url, body, params, headers, timeout, accept, name)
        return orjson.loads(payload) if payload else None

    async def _answer(
        self,
        into: type[T] | TypeAdapter[T],
        worker: str,
        base: str,
        method: str,
        path: str,
        body: BaseModel | None = None,
        **options: Unpack[_Options],
    ) -> T:
        """A call's answer, validated as `into` (a model, or an adapter for a list of them)."""
        data = await self._request(worker, base, method, path, body, **options)
        if isinstance(into, TypeAdapter):
            return into.validate_python(data)
        return into.model_validate(data)  # type: ignore[attr-defined, no-any-return]

    # --- the worker --------------------------------------------------------------------

    async def capacity(self, worker: str, base: str, timeout: float = DEFAULT_TIMEOUT) -> Capacity:
        return await self._answer(Capacity, worker, base, "GET", "/v1/capacity", timeout=timeout)

    async def offer(self, worker: str, base: str, req: OfferRequest, timeout: float) -> Offer:
        return await self._answer(Offer, worker, base, "POST", "/v1/offers", req, timeout=timeout)

    async def pin_image(self, worker: str, base: str, image: str) -> PinnedImage:
        req = PinImageRequest(image=image)
        return await self._answer(
            PinnedImage, worker, base, "POST", "/v1/images/pin", req, timeout=PIN_TIMEOUT
        )

    async def cordon(self, worker: str, base: str, cordoned: bool = True) -> Capacity:
        path = "/v1/cordon" if cordoned else "/v1/uncordon"
        return await self._answer(Capacity, worker, base, "POST", path)

    # --- machines ----------------------------------------------------------------------

    async def create(
        self, worker: str, base: str, req: CreateMachine, timeout: float, hold: float | None = None
    ) -> Machine:
        """`hold`: the machine is provisional for that many seconds: the worker destroys it
        unless `confirm` reaches it first."""
        return await self._answer(
            Machine, worker, base, "POST", "/v1/machines", req, timeout=timeout, headers=_held(hold)
        )

    async def create_batch(
        self,
        worker: str,
        base: str,
        reqs: list[CreateMachine],
        timeout: float,
        hold: float | None = None,
        confirm: list[str] | None = None,
    ) -> tuple[list[Machine | WorkerCallError], dict[str, HoldAnswer]]:
        """Several creates in one request, each answered as `create` would have: its machine, or
        the error it would have raised; and the holds of `confirm` ended, as `confirm` would
        answer (an id missing was not confirmed). A failure of the request itself is raised."""
        body = CreateBatch(machines=reqs, confirm=confirm or None)
        path = "/v1/machines/batch"
        data = await self._request(
            worker, base, "POST", path, body, timeout=timeout, headers=_held(hold)
        )
        return outcomes_of(worker, CreateOutcomes.model_validate(data), len(reqs))

    async def confirm(
        self, worker: str, base: str, machine_ids: list[str], timeout: float = DEFAULT_TIMEOUT
    ) -> ConfirmationResult:
        """End the provisional holds of machines whose creation was answered to a client."""
        body = Confirmations(ids=machine_ids)
        return await self._answer(
            ConfirmationResult, worker, base, "POST", "/v1/confirmations", body, timeout=timeout
        )

    async def machine(
        self, worker: str, base: str, machine_id: str, timeout: float = DEFAULT_TIMEOUT
    ) -> Machine:
        return await self._answer(Machine, worker, base, "GET", _path(machine_id), timeout=timeout)

    async def machines(
        self, worker: str, base: str, app: str | None = None, include_deleted: bool = False
    ) -> list[Machine]:
        """The worker's machines (of one app, if given)."""
        params = {"app": app} if app else {}
        if include_deleted:
            params["include_deleted"] = "true"
        return await self._answer(_MACHINES, worker, base, "GET", "/v1/machines", params=params)

    async def update(
        self, worker: str, base: str, machine_id: str, req: UpdateMachine, nonce: str | None
    ) -> Machine:
        return await self._answer(Machine, worker, base, "PUT", _path(machine_id), req, nonce=nonce)

    async def patch_metadata(
        self, worker: str, base: str, machine_id: str, change: MetadataChange, nonce: str | None
    ) -> Machine:
        path = _path(machine_id, "metadata")
        return await self._answer(Machine, worker, base, "PATCH", path, change, nonce=nonce)

    async def verb(
        self,
        worker: str,
        base: str,
        machine_id: str,
        op: str,
        nonce: str | None,
        body: BaseModel | None = None,
    ) -> Machine:
        """A lifecycle verb (start, stop, restart, suspend): one call for all, as each is one
        row of the worker's route table (`souk.worker.http.lifecycle`)."""
        path = _path(machine_id, op)
        return await self._answer(Machine, worker, base, "POST", path, body, nonce=nonce)

    async def signal(
        self, worker: str, base: str, machine_id: str, req: SignalRequest, nonce: str | None
    ) -> None:
        path = _path(machine_id, "signal")
        await self._request(worker, base, "POST", path, req, nonce=nonce)

    async def exec(self, worker: str, base: str, machine_id: str, req: ExecRequest) -> ExecResponse:
        """Waits as long as the command may run, and a little more for the answer."""
        path = _path(machine_id, "exec")
        timeout = req.timeout + DEFAULT_TIMEOUT
        return await self._answer(ExecResponse, worker, base, "POST", path, req, timeout=timeout)

    async def processes(
        self, worker: str, base: str, machine_id: str, params: dict[str, str]
    ) -> list[ProcessStat]:
        return await self._answer(
            _PROCESSES, worker, base, "GET", _path(machine_id, "ps"), params=params
        )

    async def holds_socket(
        self, worker: str, base: str, machine_id: str, inode: int, timeout: float = DEFAULT_TIMEOUT
    ) -> bool:
        """Whether the machine's processes hold the socket `inode` (a 404: no such machine)."""
        path = _path(machine_id, f"sockets/{inode}")
        data = await self._request(worker, base, "GET", path, timeout=timeout)
        return SocketHolder.model_validate(data).held

    async def versions(self, worker: str, base: str, machine_id: str) -> list[MachineVersion]:
        return await self._answer(_VERSIONS, worker, base, "GET", _path(machine_id, "versions"))

    async def destroy(
        self,
        worker: str,
        base: str,
        machine_id: str,
        force: bool = False,
        nonce: str | None = None,
        timeout: float = DEFAULT_TIMEOUT,
        fence: bool = False,
    ) -> Machine:
        """`fence`: the id's create may still arrive (its answer was lost); the worker refuses
        it if it does."""
        params = {"force": "true"} if force else {}
        if fence:
            params["fence"] = "true"
        path = _path(machine_id)
        return await self._answer(
            Machine,
            worker,
            base,
            "DELETE",
            path,
            params=params or None,
            timeout=timeout,
            nonce=nonce,
        )

    async def wait(
        self, worker: str, base: str, machine_id: str, params: dict[str, str], timeout: float
    ) -> tuple[bool, WaitResult]:
        """Whether the machine reached the state asked for in `params` (a 408 is a no, not an
        error), and where it is."""
        data = await self._request(
            worker,
            base,
            "GET",
            _path(machine_id, "wait"),
            params=params,
            timeout=timeout + 5.0,
            accept=(408,),
        )
        result = WaitResult.model_validate(data)  # a 408 says ok: false
        return result.ok, result

    async def events(self, worker: str, base: str, machine_id: str) -> list[MachineEvent]:
        return await self._answer(_EVENTS, worker, base, "GET", _path(machine_id, "events"))

    @contextlib.asynccontextmanager
    async def logs(
        self, worker: str, base: str, machine_id: str, params: dict[str, str]
    ) -> AsyncIterator[AsyncIterator[bytes]]:
        """The machine's output as it arrives (`stream`, `follow` in `params`); an error answer
        is raised on entry."""
        fail = functools.partial(WorkerCallError, worker)
        url, name = base + _path(machine_id, "logs"), self._server_name(worker, base)
        async with self.stream(fail, url, params, name) as chunks:
            yield chunks

    # --- leases --------------------------------------------------------------------------

    async def lease(self, worker: str, base: str, machine_id: str) -> Lease:
        return await self._answer(Lease, worker, base, "GET", _path(machine_id, "lease"))

    async def acquire_lease(
        self, worker: str, base: str, machine_id: str, req: WorkerLeaseRequest, nonce: str | None
    ) -> Lease:
        path = _path(machine_id, "lease")
        return await self._answer(Lease, worker, base, "POST", path, req, nonce=nonce)

    async def release_lease(
        self, worker: str, base: str, machine_id: str, nonce: str | None
    ) -> None:
        await self._request(worker, base, "DELETE", _path(machine_id, "lease"), nonce=nonce)

    # --- volumes -----------------------------------------------------------------------------

    async def create_volume(
        self, worker: str, base: str, req: CreateVolume, timeout: float = VOLUME_TIMEOUT
    ) -> Volume:
        return await self._answer(Volume, worker, base, "POST", "/v1/volumes", req, timeout=timeout)

    async def volumes(
        self, worker: str, base: str, app: str | None = None, timeout: float = DEFAULT_TIMEOUT
    ) -> list[Volume]:
        params = {"app": app} if app else None
        return await self._answer(
            _VOLUMES, worker, base, "GET", "/v1/volumes", params=params, timeout=timeout
        )

    async def volume(
        self, worker: str, base: str, volume_id: str, timeout: float = DEFAULT_TIMEOUT
    ) -> Volume:
        return await self._answer(
            Volume, worker, base, "GET", _volume_path(volume_id), timeout=timeout
        )

    async def update_volume(
        self, worker: str, base: str, volume_id: str, req: UpdateVolumeRequest
    ) -> Volume:
        return await self._answer(Volume, worker, base, "PUT", _volume_path(volume_id), req)

    async def destroy_volume(self, worker: str, base: str, volume_id: str) -> Volume:
        path = _volume_path(volume_id)
        return await self._answer(Volume, worker, base, "DELETE", path, timeout=VOLUME_TIMEOUT)

    async def extend_volume(
        self, worker: str, base: str, volume_id: str, req: ExtendVolumeRequest
    ) -> ExtendVolumeResponse:
        path = _volume_path(volume_id, "extend")
        return await self._answer(
            ExtendVolumeResponse, worker, base, "PUT", path, req, timeout=VOLUME_TIMEOUT
        )

    async def snapshots(self, worker: str, base: str, volume_id: str) -> list[VolumeSnapshot]:
        return await self._answer(
            _SNAPSHOTS, worker, base, "GET", _volume_path(volume_id, "snapshots")
        )

    async def snapshot_volume(self, worker: str, base: str, volume_id: str) -> VolumeSnapshot:
        path = _volume_path(volume_id, "snapshots")
        return await self._answer(
            VolumeSnapshot, worker, base, "POST", path, timeout=VOLUME_TIMEOUT
        )
