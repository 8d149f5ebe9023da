"""Reaching into a running machine: a signal to its main process, a command run inside, its
processes, and whether it holds a socket."""

from __future__ import annotations

import asyncio

from aiohttp import web

from souk import listeners
from souk.models.api import NONCE_HEADER
from souk.models.machine_ops import (
    ExecRequest,
    ExecResponse,
    ProcessStat,
    SignalRequest,
    SocketHolder,
)
from souk.pki import mtls_roles
from souk.web import ApiError, Route, read_model, reply
from souk.worker.http.errors import WRITE_ERRORS
from souk.worker.http.state import BROKERS, M, engine_of, machine_id, nonce
from souk.worker.machines import ps


async def signal(request: web.Request) -> web.Response:
    body = await read_model(request, SignalRequest)
    await engine_of(request).signal(machine_id(request), body.signal, nonce(request))
    return reply({"ok": True})


async def exec_command(request: web.Request) -> web.Response:
    body = await read_model(request, ExecRequest)
    result = await engine_of(request).exec(machine_id(request), body)
    return reply(result.model_dump(exclude_none=True))  # exit_signal only when one


async def processes(request: web.Request) -> web.Response:
    sort_by = request.query.get("sort_by") or "pid"
    order = request.query.get("order") or "asc"
    if sort_by not in ps.SORT_KEYS:
        raise ApiError(400, "invalid", f"sort_by: one of {', '.join(ps.SORT_KEYS)}")
    if order not in ("asc", "desc"):
        raise ApiError(400, "invalid", "order: asc or desc")
    return reply(await engine_of(request).processes(machine_id(request), sort_by, order))


async def socket_holder(request: web.Request) -> web.Response:
    raw = request.match_info["inode"]
    if not raw.isdigit() or len(raw) > 20:
        raise ApiError(400, "invalid", f"inode: a socket's inode number, not {raw[:40]!r}")
    inode = int(raw)
    pids = await engine_of(request).pids(machine_id(request))
    held = await asyncio.to_thread(listeners.holds, pids, inode)
    return reply(SocketHolder(inode=inode, held=held))


ROUTES = [
    Route(
        "POST",
        M + "/signal",
        signal,
        f"Send a signal to the machine's main process (a held lease's nonce in {NONCE_HEADER})",
        SignalRequest,
        errors=(404, 409, *WRITE_ERRORS),
        roles=BROKERS,
    ),
    Route(
        "POST",
        M + "/exec",
        exec_command,
        "Run a command inside the machine; its output and exit code",
        ExecRequest,
        ExecResponse,
        errors=(404, 408, 409),
        roles=BROKERS,
    ),
    Route(
        "GET",
        M + "/ps",
        processes,
        "The machine's processes",
        response=list[ProcessStat],
        query={"sort_by": f"one of {', '.join(ps.SORT_KEYS)}", "order": "asc or desc"},
        errors=(404,),
        roles=BROKERS,
    ),
    Route(
        "GET",
        M + "/sockets/{inode}",
        socket_holder,
        "Whether the machine's processes hold this socket (the proxy asks, of what listens at"
        " the machine's address)",
        response=SocketHolder,
        errors=(400, 404),
        # A proxy gets nothing else: it asks whether a machine holds the socket it is about
        # to send a request to.
        roles=mtls_roles(*BROKERS, "proxy"),
    ),
]
