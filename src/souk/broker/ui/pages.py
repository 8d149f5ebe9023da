"""The dashboard's pages, rendered on the server from the broker's view of the fleet.

Every page is one `<main>`; with `?fragment=1` only its inside is sent, which the page's script
swaps in when the change stream (`/ui/events`) says a row changed: the same rendering serves
the first load and every live update, and the script knows nothing of the markup.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections import Counter, defaultdict
from collections.abc import Iterable
from datetime import UTC, datetime
from html import escape
from importlib import resources
from typing import Any

from aiohttp import web

from souk.broker.fleet import CatalogFleet
from souk.broker.placement.journal import KEEP
from souk.broker.state import Broker, broker_of
from souk.broker.ui.session import LOGIN, PREFIX, set_session
from souk.models.catalog import MachineRow, WorkerRow
from souk.models.machine import MachineEvent
from souk.models.placement import PlacementExplanation
from souk.web import ApiError
from souk.web.streams import lapsed

TICK = 5.0  # seconds between two looks at which workers are reachable (no row changes then)
COALESCE = 0.2  # a burst of changes goes out as one event
EVENTS_OF = 10  # an app page shows the events of its most recent machines, this many
EVENTS_SHOWN = 30
EVENTS_TIMEOUT = 2.0
RELEASES_SHOWN = 10
STATIC = {"ui.js": "text/javascript", "ui.css": "text/css"}
CSP = (
    "default-src 'none'; script-src 'self'; style-src 'self' 'unsafe-inline';"
    " connect-src 'self'; img-src 'self'; form-action 'self'; frame-ancestors 'none';"
    " base-uri 'none'"
)
LIVE_STATES = ("created", "starting", "started", "stopping", "stopped", "suspended")
STREAMS = web.AppKey("ui_streams", set[asyncio.Event])  # open streams, to end at shutdown


def esc(value: object) -> str:
    return escape(str(value), quote=True)


def _html(request: web.Request, title: str, main: str, tab: str) -> web.Response:
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-store"}
    if request.query.get("fragment"):
        return web.Response(text=main, content_type="text/html", headers=headers)
    tabs = "".join(
        f'<a href="{PREFIX}{path}"{" aria-current=page" if name == tab else ""}>{name}</a>'
        for name, path in (("Fleet", ""), ("Apps", "/apps"))
    )
    text = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{esc(title)} · souk</title>
<link rel="stylesheet" href="{PREFIX}/static/ui.css">
<script src="{PREFIX}/static/ui.js" defer></script>
</head><body>
<header class="top"><a class="brand" href="{PREFIX}">souk</a><nav>{tabs}</nav>
<span id="live" class="live" title="live updates from the catalog">offline</span>
<form method="post" action="{PREFIX}/logout"><button>Log out</button></form></header>
<main id="main" data-live="{PREFIX}/events">{main}</main>
</body></html>"""
    return web.Response(text=text, content_type="text/html", headers=headers)


def _bar(label: str, used: int, total: int, unit: str = "") -> str:
    share = used / total if total else 0.0
    level = "high" if share >= 0.9 else "mid" if share >= 0.6 else "low"
    return (
        f'<div class="bar {level}" role="img" aria-label="{esc(label)}: {used} of {total}{unit}'
        f' reserved"><span class="label">{esc(label)}</span>'
        f'<span class="track"><span class="fill" style="width:{share * 100:.1f}%"></span></span>'
        f'<span class="nums">{used}/{total}{esc(unit)}</span></div>'
    )


def _badges(w: WorkerRow, reachable: bool) -> str:
    out = [] if reachable else ['<span class="badge unreachable">unreachable</span>']
    if w.cordoned:
        out.append('<span class="badge cordoned">cordoned</span>')
    if w.draining:
        out.append('<span class="badge draining">draining</span>')
    return "".join(out)


def _count(n: int, what: str) -> str:
    return f"{n} {what}" if n == 1 else f"{n} {what}s"


def _state(state: str) -> str:
    return f'<span class="state s-{esc(state)}">{esc(state)}</span>'


def _machine_link(mid: str, app: str) -> str:
    return f'<a class="mono" href="{PREFIX}/apps/{esc(app)}/machines/{esc(mid)}">{esc(mid)}</a>'


def _live(machines: Iterable[MachineRow]) -> list[MachineRow]:
    return [m for m in machines if m.state != "destroyed"]


def _worker_card(w: WorkerRow, reachable: bool, machines: list[MachineRow]) -> str:
    classes = " ".join(
        c
        for c, on in (
            ("unreachable", not reachable),
            ("cordoned", w.cordoned),
            ("draining", w.draining),
        )
        if on
    )
    kinds = ", ".join(w.cpu_kinds)
    rows = "".join(
        f'<li data-machine="{esc(m.id)}">{_machine_link(m.id, m.app)}'
        f' <span class="app">{esc(m.app)}</span> {_state(m.state)}'
        f' <span class="dim">{m.cpus} {esc(m.cpu_kind)} · {m.memory_mb} MB</span></li>'
        for m in sorted(machines, key=lambda m: (m.app, m.id))
    )
    listing = f'<ul class="machines">{rows}</ul>' if rows else '<p class="dim">no machines</p>'
    return f"""<article class="worker {classes}" data-worker="{esc(w.id)}" id="worker-{esc(w.id)}">
<header><h3>{esc(w.id)}</h3>{_badges(w, reachable)}</header>
{_bar("CPU", w.cpus_reserved, w.cpus_total)}
{_bar("memory", w.memory_mb_reserved, w.memory_mb_total, " MB")}
<p class="dim">{esc(kinds)} CPUs · <span class="mono">{esc(w.address)}</span></p>
{listing}
</article>"""


def fleet_main(b: Broker) -> str:
    fleet = b.fleet
    reachable = {w.id for w in fleet.workers(reachable_only=True)}
    by_worker: dict[str, list[MachineRow]] = defaultdict(list)
    for m in _live(fleet.machines()):
        by_worker[m.worker_id].append(m)
    regions: dict[str, list[WorkerRow]] = defaultdict(list)
    for w in fleet.workers(reachable_only=False):
        regions[w.region].append(w)
    if not regions:
        return "<h1>Fleet</h1><p>No workers yet.</p>"
    total = sum(len(ws) for ws in regions.values())
    out = [f"<h1>Fleet <small>{total} workers in {len(regions)} regions</small></h1>"]
    for region in sorted(regions):
        workers = sorted(regions[region], key=lambda w: w.id)
        count = sum(len(by_worker[w.id]) for w in workers)
        cards = "".join(_worker_card(w, w.id in reachable, by_worker[w.id]) for w in workers)
        out.append(
            f'<section class="region" data-region="{esc(region)}"><h2>{esc(region)}'
            f" <small>{_count(len(workers), 'worker')} · {_count(count, 'machine')}</small></h2>"
            f'<div class="workers">{cards}</div></section>'
        )
    return "".join(out)


def apps_main(b: Broker) -> str:
    counts: dict[str, Counter[str]] = defaultdict(Counter)
    for m in _live(b.fleet.machines()):
        counts[m.app][m.state] += 1
    rows = "".join(
        f'<tr><td><a href="{PREFIX}/apps/{esc(a.name)}">{esc(a.name)}</a></td>'
        f"<td>{esc(a.org)}</td><td>{sum(counts[a.name].values())}</td>"
        f"<td>{' '.join(f'{_state(s)} {n}' for s, n in sorted(counts[a.name].items()))}</td></tr>"
        for a in sorted(b.fleet.apps(), key=lambda a: a.name)
    )
    if not rows:
        return "<h1>Apps</h1><p>No apps yet.</p>"
    return (
        "<h1>Apps</h1><div class=scroll><table><thead><tr><th>app</th><th>org</th>"
        f"<th>machines</th><th>states</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )


def _releases(metadata: dict[str, Any]) -> list[dict[str, Any]]:
    """The app's releases, newest first, as deploys record them in its metadata."""
    found = []
    for key, value in metadata.items():
        if not key.startswith("release.") or not key[len("release.") :].isdigit():
            continue
        with contextlib.suppress(ValueError, TypeError):
            release = json.loads(value) if isinstance(value, str) else value
            if isinstance(release, dict):
                found.append(release)
    found.sort(key=lambda r: int(r.get("version", 0)), reverse=True)
    return found[:RELEASES_SHOWN]


Where = tuple[str, str, str]  # machine id, app, worker id
Event = tuple[str, str, MachineEvent]  # machine id, app, event


async def _events(b: Broker, machines: list[Where]) -> list[Event]:
    """The machines' events from their workers (the catalog holds none), newest first; a worker
    that does not answer in time leaves its machines' events out."""

    async def one(mid: str, app: str, wid: str) -> list[Event]:
        worker = b.fleet.worker(wid)
        if worker is None:
            return []
        got = await asyncio.wait_for(b.client.events(wid, worker.address, mid), EVENTS_TIMEOUT)
        return [(mid, app, e) for e in got]

    results = await asyncio.gather(*(one(*m) for m in machines), return_exceptions=True)
    out = [event for r in results if not isinstance(r, BaseException) for event in r]
    out.sort(key=lambda event: event[2].timestamp, reverse=True)
    return out


def _when(ms: float) -> str:
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _events_table(events: list[Event]) -> str:
    if not events:
        return '<p class="dim">no events</p>'
    rows = "".join(
        f"<tr><td>{_when(e.timestamp)}</td><td>{_machine_link(mid, app)}</td>"
        f"<td>{esc(e.type)}</td><td>{esc(e.status)}</td><td>{esc(e.source)}</td></tr>"
        for mid, app, e in events[:EVENTS_SHOWN]
    )
    return (
        "<div class=scroll><table><thead><tr><th>time (UTC)</th><th>machine</th><th>type</th>"
        f"<th>status</th><th>source</th></tr></thead><tbody>{rows}</tbody></table></div>"
    )


async def app_main(b: Broker, name: str) -> str:
    app = b.require_app(name)
    machines = sorted(_live(b.fleet.machines(app=name)), key=lambda m: (m.region, m.id))
    states = sorted({m.state for m in machines})
    grid: dict[str, Counter[str]] = defaultdict(Counter)
    for m in machines:
        grid[m.region][m.state] += 1
    head = "".join(f"<th>{_state(s)}</th>" for s in states)
    body = "".join(
        f"<tr><th>{esc(r)}</th>{''.join(f'<td>{grid[r][s] or str()}</td>' for s in states)}</tr>"
        for r in sorted(grid)
    )
    summary = (
        f"<div class=scroll><table class=grid><thead><tr><th>region</th>{head}</tr></thead>"
        f"<tbody>{body}</tbody></table></div>"
        if machines
        else '<p class="dim">no machines</p>'
    )
    listing = "".join(
        f"<tr><td>{_machine_link(m.id, m.app)}</td><td>{esc(m.name)}</td><td>{esc(m.region)}</td>"
        f"<td>{esc(m.worker_id)}</td><td>{_state(m.state)}</td>"
        f"<td>{m.cpus} {esc(m.cpu_kind)} · {m.memory_mb} MB</td></tr>"
        for m in machines
    )
    table = (
        "<div class=scroll><table><thead><tr><th>machine</th><th>name</th><th>region</th>"
        f"<th>worker</th><th>state</th><th>size</th></tr></thead><tbody>{listing}</tbody>"
        "</table></div>"
        if machines
        else ""
    )
    releases = "".join(
        f"<tr><td>v{esc(r.get('version', '?'))}</td><td>{esc(r.get('status', ''))}</td>"
        f"<td>{esc(r.get('strategy', ''))}</td><td class=mono>{esc(r.get('image') or '')}</td>"
        f"<td>{esc(r.get('created_at', ''))}</td><td>{esc(r.get('description', ''))}</td></tr>"
        for r in _releases(app.metadata)
    )
    release_table = (
        "<div class=scroll><table><thead><tr><th>release</th><th>status</th><th>strategy</th>"
        f"<th>image</th><th>created</th><th>description</th></tr></thead><tbody>{releases}"
        "</tbody></table></div>"
        if releases
        else '<p class="dim">no releases (deploys with <code>souk deploy</code> record them)</p>'
    )
    recent = sorted(machines, key=lambda m: m.updated_at, reverse=True)[:EVENTS_OF]
    events = _events_table(await _events(b, [(m.id, m.app, m.worker_id) for m in recent]))
    return (
        f"<h1>App {esc(name)} <small>{_count(len(machines), 'machine')}</small></h1>"
        f"<h2>Machines by region and state</h2>{summary}{table}"
        f"<h2>Releases</h2>{release_table}<h2>Recent events</h2>{events}"
    )


def placement_table(found: PlacementExplanation) -> str:
    rows = "".join(
        f'<tr class="o-{c.outcome}" data-candidate="{esc(c.worker)}"><td>{esc(c.worker)}</td>'
        f"<td>{esc(c.outcome)}</td>"
        f"<td>{'' if c.score is None else f'{c.score:.4f}'}</td>"
        f"<td>{'' if c.rank is None else c.rank}</td>"
        f"<td>{'' if c.cpus_free is None else c.cpus_free}</td>"
        f"<td>{'' if c.memory_mb_free is None else c.memory_mb_free}</td>"
        f"<td>{esc(c.reason or '')}</td></tr>"
        for c in found.candidates
    )
    return (
        f"<p>Placed on <strong>{esc(found.winner)}</strong> in {esc(found.region)} by the"
        f" <strong>{esc(found.strategy)}</strong> strategy and the {esc(found.policy)} policy,"
        f" for {found.cpus} {esc(found.cpu_kind)} CPU · {found.memory_mb} MB, in"
        f" {found.took_ms:.1f} ms; {len(found.candidates)} workers looked at.</p>"
        '<div class=scroll><table class="placement"><thead><tr><th>worker</th><th>outcome</th>'
        "<th>score</th><th>rank</th><th>CPUs free</th><th>MB free</th><th>reason</th></tr>"
        f"</thead><tbody>{rows}</tbody></table></div>"
    )


async def machine_main(b: Broker, app: str, mid: str) -> str:
    b.require_app(app)
    row = b.fleet.machine(mid)
    if row is not None and row.app == app:
        worker = row.worker_id
        facts = [
            ("state", _state(row.state)),
            ("region", esc(row.region)),
            ("worker", esc(row.worker_id)),
            ("size", f"{row.cpus} {esc(row.cpu_kind)} · {row.memory_mb} MB"),
            ("image", f'<span class="mono">{esc(row.image or "")}</span>'),
            ("private IP", f'<span class="mono">{esc(row.private_ip or "")}</span>'),
            ("updated", esc(row.updated_at)),
        ]
    else:  # not in the catalog yet, or placed a moment ago: its worker answers, or 404
        machine = await b.machine(app, mid)
        worker, guest = machine.worker, machine.config.guest
        facts = [
            ("state", _state(machine.state)),
            ("region", esc(machine.region)),
            ("worker", esc(worker)),
            ("size", f"{guest.cpus} {esc(guest.cpu_kind)} · {guest.memory_mb} MB"),
        ]
    events = _events_table(await _events(b, [(mid, app, worker)]))
    dl = "".join(f"<dt>{k}</dt><dd>{v}</dd>" for k, v in facts)
    found = b.placer.journal.explanation(app, mid)
    if found is not None:
        placement = placement_table(found)
    else:
        placement = (
            '<p class="dim not-recorded">This broker did not record this placement: the machine'
            f" was placed through another broker, or more than {KEEP} creates ago.</p>"
        )
    return (
        f'<h1>Machine <span class="mono">{esc(mid)}</span> <small>app'
        f' <a href="{PREFIX}/apps/{esc(app)}">{esc(app)}</a></small></h1>'
        f"<dl class=facts>{dl}</dl><h2>Placement explained</h2>{placement}"
        f"<h2>Events</h2>{events}"
    )


# --- handlers -----------------------------------------------------------------------------


async def fleet_page(request: web.Request) -> web.Response:
    return _html(request, "Fleet", fleet_main(broker_of(request)), "Fleet")


async def apps_page(request: web.Request) -> web.Response:
    return _html(request, "Apps", apps_main(broker_of(request)), "Apps")


async def app_page(request: web.Request) -> web.Response:
    name = request.match_info["app"]
    return _html(request, name, await app_main(broker_of(request), name), "Apps")


async def machine_page(request: web.Request) -> web.Response:
    app, mid = request.match_info["app"], request.match_info["id"]
    return _html(request, mid, await machine_main(broker_of(request), app, mid), "Apps")


async def login_form(request: web.Request) -> web.Response:
    why = request.query.get("why", "")
    note = f'<p class="why">{esc(why)}</p>' if why else ""
    main = f"""<h1>Log in</h1>{note}
<form class="login" method="post" action="{LOGIN}">
<label for="token">Operator token</label>
<input id="token" name="token" type="password" autocomplete="off" required>
<button type="submit">Log in</button></form>
<p class="dim">The token is kept in an HttpOnly cookie for this dashboard only.
<code>souk dev</code> prints a link that logs in.</p>"""
    text = f"""<!doctype html>
<html lang="en"><head><meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>Log in · souk</title>
<link rel="stylesheet" href="{PREFIX}/static/ui.css">
<script src="{PREFIX}/static/ui.js" defer></script>
</head><body><header class="top"><a class="brand" href="{PREFIX}">souk</a></header>
<main id="main">{main}</main></body></html>"""
    headers = {"Content-Security-Policy": CSP, "Cache-Control": "no-store"}
    return web.Response(text=text, content_type="text/html", headers=headers)


async def login(request: web.Request) -> web.Response:
    """Keeps the token in the cookie and goes to the fleet: the access middleware checks it
    there, and a token it refuses comes back here with the reason."""
    form = await request.post()
    token = form.get("token")
    if not isinstance(token, str) or not token.strip() or not token.isascii():
        raise ApiError(400, "invalid", "token: a token is needed")
    response = web.Response(status=303, headers={"Location": PREFIX})
    set_session(response, token.strip(), request.secure)
    return response


async def logout(_: web.Request) -> web.Response:
    response = web.Response(status=303, headers={"Location": LOGIN})
    response.del_cookie("souk_ui", path=PREFIX)
    return response


async def static(request: web.Request) -> web.Response:
    name = request.path.rsplit("/", 1)[-1]
    kind = STATIC.get(name)
    if kind is None:
        raise ApiError(404, "not_found", f"no file {name}")
    text = resources.files("souk.broker.ui").joinpath("static", name).read_text()
    return web.Response(text=text, content_type=kind, headers={"Cache-Control": "no-cache"})


async def events(request: web.Request) -> web.StreamResponse:
    """Server-sent events: `change` (with the tables changed) after the catalog applies rows,
    coalesced; also when a worker turns reachable or unreachable, which changes no row. Ends
    when the broker shuts down, or within a tick of its token no longer holding."""
    b = broker_of(request)
    changed = asyncio.Event()
    stop = asyncio.Event()
    request.app[STREAMS].add(stop)
    tables: set[str] = set()

    async def follow() -> None:
        fleet = b.fleet
        if not isinstance(fleet, CatalogFleet):
            return  # a static fleet has no stream: the reachability look below still runs
        async for change in fleet.view.subscribe(frozenset({"workers", "machines", "apps"})):
            tables.add(change.table)
            changed.set()

    def reachable() -> frozenset[str]:
        return frozenset(w.id for w in b.fleet.workers(reachable_only=True))

    response = web.StreamResponse(
        headers={"Content-Type": "text/event-stream", "Cache-Control": "no-store"}
    )
    await response.prepare(request)
    task = asyncio.create_task(follow())
    seen = reachable()
    try:
        await response.write(b"retry: 2000\n\n")
        while not stop.is_set():
            waits = [asyncio.ensure_future(e.wait()) for e in (changed, stop)]
            _, pending = await asyncio.wait(
                waits, timeout=TICK, return_when=asyncio.FIRST_COMPLETED
            )
            for p in pending:
                p.cancel()
            if stop.is_set() or lapsed(request) is not None:
                break  # the broker stops, or the operator's token was revoked or has expired
            now = reachable()
            if now != seen:
                seen = now
                tables.add("workers")
                changed.set()
            if not changed.is_set():
                await response.write(b": keepalive\n\n")
                continue
            await asyncio.sleep(COALESCE)
            changed.clear()
            data = json.dumps({"tables": sorted(tables), "at": time.time()})
            tables.clear()
            await response.write(f"event: change\ndata: {data}\n\n".encode())
    except (ConnectionResetError, ConnectionError):
        pass
    finally:
        request.app[STREAMS].discard(stop)
        task.cancel()
        with contextlib.suppress(asyncio.CancelledError, Exception):
            await task
    return response


def install(app: web.Application) -> None:
    """What the dashboard needs of the app: its open streams end when the broker shuts down."""
    app[STREAMS] = set()

    async def end_streams(_: web.Application) -> None:
        streams: set[asyncio.Event] = app[STREAMS]
        for stop in streams:
            stop.set()

    app.on_shutdown.append(end_streams)
