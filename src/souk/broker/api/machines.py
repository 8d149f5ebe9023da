"""Machines: placed by the placer, then driven on the worker that holds each one, the
machine's only writer."""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from typing import TypeVar, get_args

from aiohttp import web
from pydantic import BaseModel, ValidationError

from souk.broker.api import leases, volumes
from souk.broker.api.answers import fly_reply, public
from souk.broker.api.errors import refusal
from souk.broker.api.params import flag, lease_nonce, machine_ids, passed, policy, strategy
from souk.broker.api.secrets import machine_secrets
from souk.broker.auth import grant_of
from souk.broker.placement.pipeline import NoCapacity
from souk.broker.placement.reservation import keyed_prefix
from souk.broker.secrets import SecretRefused, check_files
from souk.broker.state import IDEMPOTENCY, Broker, broker_of
from souk.clients.workers import WorkerCallError
from souk.models.api import (
    CreateMachineRequest,
    OkResponse,
    PublicMachine,
    UpdateMachineRequest,
    WorkerLeaseRequest,
)
from souk.models.catalog import AppRow
from souk.models.fly_wire import split_unknown
from souk.models.limits import INCOMING
from souk.models.machine import CreateMachine, Machine, MachineState, UpdateMachine
from souk.models.machine_config import MachineConfig
from souk.models.wire import DEFAULT_NETWORK
from souk.web import ApiError, number, read_json, read_model, reply
from souk.web.body import BODY_KEY
from souk.web.streams import while_allowed

MAX_WAIT = 60
IDEMPOTENCY_HEADER = "Idempotency-Key"
MAX_KEY = 255
IGNORED_HEADER = "souk-ignored-fields"
MAX_IGNORED = 32
# Workers' refusals a 412 names (the unreachable first); the rest are counted in
# `refusals_omitted`: in a region of 10,000 workers all of them would be a megabyte an answer.
MAX_REFUSALS_SHOWN = 100
M = TypeVar("M", bound=BaseModel)


async def read_fly_request(request: web.Request, model: type[M]) -> tuple[M, list[str]]:
    """A create or update as a Fly client sends it: fields of its config that souk does not
    know are ignored, as Fly's server ignores them, and returned to be named back (header
    `souk-ignored-fields`, the create event), so a typo is not silent.

    Validated first as it came: every model of a config refuses fields it does not know, so a
    body that validates has none to ignore, and walking it for them (most bodies, on every
    create) is skipped. One that does not is read as before: its unknown fields taken out and
    named, then validated again, which answers what it answered before."""
    data = await read_json(request)
    with contextlib.suppress(ValidationError):
        return model.model_validate(data, context=INCOMING), []
    ignored: list[str] = []
    if isinstance(data, dict) and isinstance(data.get("config"), dict):
        config, ignored = split_unknown(MachineConfig, data["config"], "config")
        request[BODY_KEY] = {**data, "config": config}
        if len(ignored) > MAX_IGNORED:  # named back within a header's and an event's room
            more = len(ignored) - MAX_IGNORED + 1
            ignored = [*ignored[: MAX_IGNORED - 1], f"and {more} more"]
    return await read_model(request, model), ignored


def with_ignored(response: web.Response, ignored: list[str]) -> web.Response:
    if ignored:
        response.headers[IGNORED_HEADER] = ", ".join(ignored)
    return response


async def list_machines(request: web.Request) -> web.Response:
    b = broker_of(request)
    app = request.match_info["app"]
    b.require_app(app)
    region = request.query.get("region") or None
    states = {s for s in request.query.get("state", "").split(",") if s}
    unknown = states - set(get_args(MachineState))
    if unknown:
        raise ApiError(400, "invalid", f"state: unknown state {sorted(unknown)[0]!r}")
    include = flag(request, "include_deleted")
    meta = {k[len("metadata.") :]: v for k, v in request.query.items() if k.startswith("metadata.")}
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
    return fly_reply(out)


async def create_machine(request: web.Request) -> web.StreamResponse:
    b = broker_of(request)
    app = request.match_info["app"]
    body, ignored = await read_fly_request(request, CreateMachineRequest)
    chosen_strategy, chosen_policy = strategy(request), policy(request)
    row = b.require_app(app)
    pinned, region = await volumes.pin_to_volume(
        b, app, body.region or b.default_region, body.config
    )
    if b.before_place is not None:
        await b.before_place()
    secrets = with_secrets(request, app, body.config, body.skip_secrets, row)
    create = CreateMachine(
        app=app,
        config=body.config,
        name=body.name,
        start=not body.skip_launch,
        secrets=secrets,
        network=row.network if row.network != DEFAULT_NETWORK else None,
        ignored_fields=ignored or None,
    )
    prefix = idempotency_prefix(request, app)
    if prefix is not None:
        earlier = await b.keyed(app, prefix, region)
        if earlier is not None:  # a retry: a broker killed before it answered left it unconfirmed
            return await answered(request, public(earlier), b, _address(b, earlier), ignored)
    try:
        machine = await b.placer.place(
            region,
            create,
            chosen_strategy,
            chosen_policy,
            avoid=frozenset(body.avoid_workers) | pinned,
            id_prefix=prefix,
        )
    except NoCapacity as exc:
        if exc.asked == 0 and pinned:
            raise ApiError(
                412,
                "volume_unavailable",
                "mounts: the volume's worker is not reachable (a volume never moves)",
                {"region": exc.region},
            ) from None
        if exc.asked == 0 and region is not None:  # not a worker there, reachable or not
            regions = b.placer.regions()
            raise ApiError(
                400,
                "invalid",
                f"region: no region {region!r} in this cluster;"
                f" its regions: {', '.join(regions) or 'none'}",
                {"regions": regions},
            ) from None
        shown = (r for r in exc.refusals if r.worker not in pinned)
        refusals = [r.model_dump() for r in itertools.islice(shown, MAX_REFUSALS_SHOWN)]
        details = {"region": exc.region, "workers_asked": exc.asked, "refusals": refusals}
        if not pinned and len(exc.refusals) > len(refusals):
            details["refusals_omitted"] = len(exc.refusals) - len(refusals)
        message = exc.message()
        if pinned:  # the others were never candidates: only the volume's worker says why
            message = "mounts: the volume's worker cannot take this machine (a volume never moves)"
        raise ApiError(412, "insufficient_capacity", message, details) from None
    address = _address(b, machine)
    b.hint(machine, address)
    nonce = None
    if body.lease_ttl:
        lease = WorkerLeaseRequest(ttl=body.lease_ttl, owner=grant_of(request).token_id)
        nonce = (await leases.take(b, app, machine.id, lease)).nonce
    return await answered(request, public(machine, nonce), b, address, ignored)


def _address(b: Broker, machine: Machine) -> str:
    if address := b.placer.cache.address(machine.worker):
        return address
    worker = b.fleet.worker(machine.worker)
    address = worker.address if worker else ""
    if not address:
        for row in b.fleet.workers(region=machine.region, reachable_only=False):
            if row.id == machine.worker:
                address = row.address
    return address


async def answered(
    request: web.Request,
    machine: PublicMachine,
    b: Broker,
    address: str,
    ignored: list[str] | None = None,
) -> web.Response:
    """Send the created machine to the client, then confirm it to its worker: a machine whose
    answer could not be sent stays provisional there and is destroyed when its hold ends."""
    response = with_ignored(fly_reply(machine), ignored or [])
    await response.prepare(request)
    await response.write_eof()
    if address:
        b.placer.reserver.confirm(machine.worker, address, machine.id)
    return response


def with_secrets(
    request: web.Request,
    app: str,
    config: MachineConfig,
    skip: bool | None,
    row: AppRow | None = None,
) -> dict[str, str]:
    """The app's secrets for the worker, each file's secret checked against them. `row`: the
    app's, when the caller has read it already."""
    secrets = machine_secrets(request, app, skip, row)
    try:
        check_files(config, secrets)
    except SecretRefused as exc:
        raise refusal(exc) from None
    return secrets


def idempotency_prefix(request: web.Request, app: str) -> str | None:
    """The id prefix of a create with an `Idempotency-Key` header, or None without one."""
    key = request.headers.get(IDEMPOTENCY_HEADER)
    if key is None:
        return None
    if not 1 <= len(key) <= MAX_KEY or not key.isprintable():
        raise ApiError(400, "invalid", f"{IDEMPOTENCY_HEADER}: 1 to {MAX_KEY} printable characters")
    return keyed_prefix(request.app[IDEMPOTENCY], app, key)


async def get_machine(request: web.Request) -> web.Response:
    return fly_reply(public(await broker_of(request).machine(*machine_ids(request))))


async def update_machine(request: web.Request) -> web.Response:
    b = broker_of(request)
    app, mid = machine_ids(request)
    body, ignored = await read_fly_request(request, UpdateMachineRequest)
    current = await b.machine(app, mid)
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
    secrets = with_secrets(request, app, body.config, body.skip_secrets)
    start = False if body.skip_launch else None
    update = UpdateMachine(config=body.config, start=start, secrets=secrets)
    try:
        worker, address = await b.find(app, mid)
        machine = await b.client.update(worker, address, mid, update, lease_nonce(request))
    except WorkerCallError as exc:
        if exc.http_status != 412:
            raise
        details = {**exc.details, "region": current.region, "worker": current.worker}
        raise ApiError(
            412,
            exc.reason if exc.reason == "volume_unavailable" else "insufficient_capacity",
            f"{exc.message} (updates happen in place, on the same worker)",
            details,
        ) from None
    return with_ignored(fly_reply(public(machine)), ignored)


async def destroy_machine(request: web.Request) -> web.Response:
    app, mid = machine_ids(request)
    force = flag(request, "force")
    b = broker_of(request)
    worker, address = await b.find(app, mid)
    try:
        machine = await b.client.destroy(worker, address, mid, force, lease_nonce(request))
    except WorkerCallError as exc:
        if force or exc.reason != "invalid_state":
            raise
        # Fly refuses to destroy a running machine without force with a 412
        # `failed_precondition`; clients written against it expect that status.
        raise ApiError(
            412,
            "failed_precondition",
            f"{exc.message} (destroy with force=true to kill it)",
            exc.details or None,
        ) from None
    return fly_reply(public(machine))


async def wait_machine(request: web.Request) -> web.Response:
    b = broker_of(request)
    app, mid = machine_ids(request)
    state = request.query.get("state", "started")
    if state not in get_args(MachineState):
        raise ApiError(400, "invalid", f"state: unknown state {state!r}")
    timeout = number(request, "timeout", float(MAX_WAIT))
    params = {"state": state, "timeout": f"{timeout:g}"}
    if request.query.get("instance_id"):
        params["instance_id"] = request.query["instance_id"]
    worker, address = await b.find(app, mid)
    ok, result = await b.client.wait(worker, address, mid, params, timeout)
    if ok:
        return reply(OkResponse())
    return web.json_response(
        {
            "error": f"machine {mid} did not reach {state} within {timeout:g}s",
            "status": "timeout",
            "code": "timeout",
            "state": result.state,
            "instance_id": result.instance_id,
        },
        status=408,
    )


async def machine_logs(request: web.Request) -> web.StreamResponse:
    b = broker_of(request)
    app, mid = machine_ids(request)
    await b.machine(app, mid)
    worker, address = await b.find(app, mid)
    params = passed(request, "stream", "follow")
    async with b.client.logs(worker, address, mid, params) as chunks:
        response = web.StreamResponse(headers={"Content-Type": "text/plain"})
        await response.prepare(request)
        try:
            async for chunk in while_allowed(request, chunks):
                await response.write(chunk)
        except WorkerCallError:
            pass  # the worker went away mid-stream: the answer has started, so it just ends
        except ApiError:
            pass  # the caller's token was revoked or has expired: the stream ends there
        return response
