"""What a flood of idle connections costs each part that listens, and what it leaves behind.

Each part runs as its own process on loopback with its default listener limits (a worker
serving mutual TLS, a broker and a proxy serving HTTPS, `souk catalog serve` plain HTTP). For
each, `--connections` connections are opened to it and held, and closed; its resident memory
(VmRSS) is read before, while they are held, and once they have closed and memory has settled.
Each part is flooded three ways, in one process each:

- bare: TCP connections that send nothing (the review's flood), from one address;
- bare, spread: the same from `--sources` addresses (127.0.0.2 and up, all this host), so that
  the cap on connections in all is what stops them, not the one per client;
- begun: spread, each sending the first byte of a TLS handshake (or of a request line, to the
  plain part), so the part builds its TLS (or HTTP) state for every one it admits.

`admitted` is how many of them the part still held once it had accepted them all; `served` says
whether an ordinary request from 127.0.0.1 was answered while they were held.

Then what the bounds cost a client that opens a connection per request: two servers of one
trivial route in child processes, one through `BoundedSite` and one through aiohttp's
`TCPSite`, taking `--churn` connections each (one request each, `Connection: close`) in four
alternating rounds; the CPU each server used per connection, and their ratio.

    .venv/bin/python bench/flood.py              # about three minutes
    .venv/bin/python bench/flood.py --json
"""

from __future__ import annotations

import argparse
import asyncio
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web
from rich.table import Table

from _harness import cpu_ms, open_files, report

from souk.pki import init_ca
from souk.web import runner
from souk.web.listener import BoundedSite
from tests.support.nats import NatsServer
from tests.support.parts import (
    PARTS,
    TLS_RECORD_START,
    Part,
    close_all,
    count_hung_up,
    flood,
    running_part,
)
from tests.support.pki import Pki

SETTLE = 2.0  # seconds RSS must hold still to count as settled
SETTLE_LIMIT = 20.0


@dataclass
class Row:
    part: str
    flood: str
    sources: int
    connections: int
    admitted: int
    served: bool
    rss_before_mb: float
    rss_during_mb: float
    rss_after_mb: float

    @property
    def after_ratio(self) -> float:
        return self.rss_after_mb / self.rss_before_mb


def settled_rss(part: Part) -> float:
    """Its RSS once it has not moved by more than 1 MB for `SETTLE` seconds."""
    deadline = time.monotonic() + SETTLE_LIMIT
    last, since = part.rss_mb(), time.monotonic()
    while time.monotonic() < deadline:
        time.sleep(0.25)
        now = part.rss_mb()
        if abs(now - last) > 1:
            last, since = now, time.monotonic()
        elif time.monotonic() - since >= SETTLE:
            break
    return last


def served(part: Part) -> bool:
    try:
        return part.request(timeout=5) < 500
    except OSError:
        return False


def flood_once(
    kind: str, work: Path, pki: Pki, nats: str, name: str, sources: int, count: int
) -> Row:
    with running_part(kind, work, pki, nats) as part:
        part.request()
        before = settled_rss(part)
        first = b""
        if name == "begun":
            first = TLS_RECORD_START if part.client_tls else b"GET / HTTP/1.1\r\n"
        socks: list[socket.socket] = []
        try:
            for n in range(sources):
                share = count // sources + (1 if n < count % sources else 0)
                socks += flood(part.port, share, f"127.0.0.{2 + n}", first)
            during = settled_rss(part)
            admitted = len(socks) - count_hung_up(socks)
            answered = served(part)
        finally:
            close_all(socks)
        after = settled_rss(part)
        return Row(kind, name, sources, count, admitted, answered, before, during, after)


async def serve_trivially(site_kind: str) -> None:
    """Child process: one route answering "ok", through `site_kind` (bounded or aiohttp), on a
    loopback port it prints."""
    app = web.Application()

    async def ok(_: web.Request) -> web.Response:
        return web.Response(text="ok")

    app.router.add_get("/", ok)
    run = runner(app)
    await run.setup()
    if site_kind == "bounded":
        await BoundedSite(run, "127.0.0.1", 0).start()
    else:
        await web.TCPSite(run, "127.0.0.1", 0, backlog=1024).start()
    print(run.addresses[0][1], flush=True)
    await asyncio.Event().wait()


def churn(connections: int) -> dict[str, float]:
    """CPU ms per connection of each server, over four alternating rounds."""
    servers = {
        kind: subprocess.Popen(
            [sys.executable, __file__, "--serve", kind], stdout=subprocess.PIPE, text=True
        )
        for kind in ("bounded", "aiohttp")
    }
    try:
        ports = {kind: int(proc.stdout.readline()) for kind, proc in servers.items() if proc.stdout}
        used = dict.fromkeys(servers, 0.0)
        request = b"GET / HTTP/1.1\r\nHost: bench\r\nConnection: close\r\n\r\n"
        for n in range(4):
            for kind in sorted(servers, reverse=n % 2 == 1):
                began = cpu_ms(servers[kind].pid)
                for _ in range(connections):
                    with socket.create_connection(("127.0.0.1", ports[kind])) as sock:
                        sock.sendall(request)
                        while sock.recv(65536):
                            pass
                used[kind] += cpu_ms(servers[kind].pid) - began
        return {kind: ms / (4 * connections) for kind, ms in used.items()}
    finally:
        for proc in servers.values():
            proc.kill()
            proc.wait()


def table(rows: list[Row]) -> Table:
    out = Table(title="RSS of each part around a flood of idle connections (MB)")
    for column in ("part", "flood", "sources", "admitted", "served", "before", "during"):
        out.add_column(column, justify="left" if column in ("part", "flood") else "right")
    out.add_column("after", justify="right")
    out.add_column("after / before", justify="right")
    for r in rows:
        out.add_row(
            r.part,
            r.flood,
            str(r.sources),
            f"{r.admitted} of {r.connections}",
            "yes" if r.served else "no",
            f"{r.rss_before_mb:.0f}",
            f"{r.rss_during_mb:.0f}",
            f"{r.rss_after_mb:.0f}",
            f"{r.after_ratio:.2f}",
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--connections", type=int, default=5000, help="idle connections per flood")
    parser.add_argument("--sources", type=int, default=20, help="addresses of a spread flood")
    parser.add_argument("--parts", nargs="*", default=list(PARTS), choices=PARTS)
    parser.add_argument("--churn", type=int, default=1500, help="connections per churn round")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--serve", choices=("bounded", "aiohttp"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.serve:
        asyncio.run(serve_trivially(args.serve))
        return
    open_files(args.connections + 1024)  # every connection held here, and the parts' own
    floods: list[tuple[str, int]] = [("bare", 1), ("bare", args.sources), ("begun", args.sources)]
    rows: list[Row] = []
    with tempfile.TemporaryDirectory(prefix="souk-flood-") as tmp, NatsServer() as nats:
        pki = Pki(Path(tmp))
        init_ca(pki.ca_dir)
        for kind in args.parts:
            for n, (name, sources) in enumerate(floods):
                work = Path(tmp) / f"{kind}-{n}"
                row = flood_once(kind, work, pki, nats.url, name, sources, args.connections)
                rows.append(row)
                print(f"{kind}, {name} from {sources}: done", file=sys.stderr)
    report(rows, table(rows), args.json)
    per = churn(args.churn)
    ratio = per["bounded"] / per["aiohttp"]
    print(
        f"a connection per request: {per['bounded'] * 1000:.0f} µs of server CPU per connection"
        f" through BoundedSite, {per['aiohttp'] * 1000:.0f} through aiohttp's TCPSite"
        f" (ratio {ratio:.2f})",
        file=sys.stderr if args.json else sys.stdout,
    )


if __name__ == "__main__":
    main()
