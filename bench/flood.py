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

    .venv/bin/python bench/flood.py              # about two minutes
    .venv/bin/python bench/flood.py --json
"""

from __future__ import annotations

import argparse
import socket
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

from rich.table import Table

from _harness import open_files, report

from souk.pki import init_ca
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
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
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


if __name__ == "__main__":
    main()
