"""The catalog over HTTP, on every node that runs a replica (broker, proxy, `souk catalog`).

Each route declares the token it needs. Rows of no app (workers, images, revocations) and the
replica's own state are for operators; an app token sees the machines and apps rows of its
apps only, in lists and in the change stream alike (`souk.web.Audience`)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from aiohttp import web

from souk.catalog.replica import Replica, ResyncNeeded
from souk.models.catalog import TABLE_NAMES, MachineRow, RowChange, WorkerRow
from souk.web import (
    ApiError,
    Audience,
    Number,
    Permission,
    Route,
    audience_of,
    in_path,
    in_query,
    reply,
    whole,
)
from souk.web.query import SQLITE_MAX
from souk.web.streams import while_allowed

APP_TABLES = frozenset({"machines", "apps"})  # rows that belong to an app


def _visible(audience: Audience, shown: set[str]) -> Callable[[RowChange], bool]:
    """Whether a change may go to this audience. A machine row's deletion names no app, so it
    goes to a caller without fleet rights only if the stream showed that row before."""

    def visible(change: RowChange) -> bool:
        if audience.fleet:
            return True
        if change.table == "apps":
            return audience.sees(change.key)
        if change.table != "machines":
            return False
        if change.row is None:
            return change.key in shown
        seen = audience.sees(str(change.row.get("app")), change.key, change.row.get("region"))
        if seen:
            shown.add(change.key)
        return seen

    return visible


def routes(replica: Replica) -> list[Route]:
    async def workers(request: web.Request) -> web.Response:
        everyone = request.query.get("all", "false").lower() in ("1", "true", "yes")
        region = request.query.get("region") or None
        return reply(replica.workers(region=region, reachable_only=not everyone))

    async def machines(request: web.Request) -> web.Response:
        q = request.query
        rows = replica.machines(app=q.get("app") or None, region=q.get("region") or None)
        if q.get("state"):
            rows = [m for m in rows if m.state == q["state"]]
        audience = audience_of(request)
        return reply([m for m in rows if audience.sees(m.app, m.id, m.region)])

    async def app_regions(request: web.Request) -> web.Response:
        return reply(replica.regions_of_app(request.match_info["app"]))

    async def status(_: web.Request) -> web.Response:
        return reply(replica.status())

    async def changes(request: web.Request) -> web.StreamResponse:
        tables = frozenset(t for t in request.query.getall("table", []) if t)
        if tables - TABLE_NAMES:
            raise ApiError(400, "unknown_table", f"tables are {', '.join(sorted(TABLE_NAMES))}")
        audience = audience_of(request)
        if not audience.fleet and tables - APP_TABLES:
            names = ", ".join(sorted(tables - APP_TABLES))
            raise ApiError(
                403, "forbidden", f"table {names}: rows of no app need an operator token"
            )
        visible = _visible(audience, set())
        asked = tables or (None if audience.fleet else APP_TABLES)
        stream = replica.subscribe(asked, whole(request, "since"))
        response: web.StreamResponse | None = None
        try:
            async for change in while_allowed(request, stream):
                if not visible(change):
                    continue
                if response is None:
                    response = await _open(request)
                await response.write(change.model_dump_json().encode() + b"\n")
        except ResyncNeeded as exc:
            raise ApiError(410, "resync_needed", str(exc), {"oldest": exc.oldest}) from None
        except ApiError:
            if response is None:  # the token lapsed before a row was sent: say so
                raise
            # else the stream ends where it is: its token was revoked or has expired
        finally:
            await stream.aclose()
        return response or web.Response(status=204)

    stream_doc = "Row changes as NDJSON, as this replica applies them; resume with since=lseq"
    query: dict[str, Any] = {"region": "only this region", "all": "include unreachable workers"}
    return [
        Route(
            "GET",
            "/v1/catalog/workers",
            workers,
            "Workers",
            response=list[WorkerRow],
            query=query,
            permission=Permission.operator("read"),
        ),
        Route(
            "GET",
            "/v1/catalog/machines",
            machines,
            "Machines, with destroyed ones for a while",
            response=list[MachineRow],
            query={"app": "only this app", "region": "only this region", "state": "only in it"},
            permission=Permission.app_read(
                in_query("app"), region=in_query("region"), own_rows=True
            ),
        ),
        Route(
            "GET",
            "/v1/catalog/apps/{app}/regions",
            app_regions,
            "Regions where the app has machines (global index)",
            response=list[str],
            permission=Permission.app_read(in_path("app")),
        ),
        Route(
            "GET",
            "/v1/catalog/status",
            status,
            "Heads, lag, quarantine",
            response=dict[str, Any],
            permission=Permission.operator("read"),
        ),
        Route(
            "GET",
            "/v1/catalog/changes",
            changes,
            stream_doc,
            query={
                "since": Number("resume after this lseq", 0, SQLITE_MAX),
                "table": "workers|machines|images",
            },
            errors=(400, 403, 410),
            permission=Permission.app_read(own_rows=True),
        ),
    ]


async def _open(request: web.Request) -> web.StreamResponse:
    response = web.StreamResponse(headers={"Content-Type": "application/x-ndjson"})
    await response.prepare(request)
    return response
