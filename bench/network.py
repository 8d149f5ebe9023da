"""The private network's costs, in one run (docs/network.md):

- **start**: create+start of a process machine (`sleep 60`) on a real in-process worker, until
  it runs, with its own network namespace (veth, routes, its nftables elements, resolv.conf
  mounted) against the same worker giving it a loopback address in the host's network. Rounds
  alternate which goes first; the ratio is of the medians.
- **dns**: the time a `.internal` question takes to be answered by the worker's DNS
  (`souk.network.dns`, over a catalog of `--machines` rows), next to a UDP echo on the same
  loopback: what the DNS itself adds to the round trip.

Run as root (namespaces), in a network namespace of its own so that nothing of the host's
changes: `sudo unshare -n .venv/bin/python bench/network.py`.

Usage: .venv/bin/python bench/network.py [--starts 40] [--rounds 3] [--questions 2000]
       [--machines 2000] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import socket
import statistics
import subprocess
import tempfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rich.table import Table

from _harness import pct, report

from souk.models.catalog import MachineRow
from souk.models.machine import CreateMachine
from souk.models.wire import DEFAULT_NETWORK
from souk.network import dns
from souk.worker import addresses
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from tests.support.engines import destroy_all, settings

CLUSTER = addresses.DEFAULT_PREFIX


@dataclass
class Row:
    what: str
    n: int
    p50_ms: float
    p90_ms: float
    ratio: float | None = None


@contextmanager
def shared_network(on: bool) -> Iterator[None]:
    """The worker as one that is not root would run it: loopback addresses, no namespaces."""
    real = addresses.isolated
    if on:
        addresses.isolated = lambda: False
    try:
        yield
    finally:
        addresses.isolated = real


async def starts(tmp: Path, n: int, shared: bool) -> list[float]:
    times = []
    with shared_network(shared):
        s = settings(tmp, cpus=4 * n, memory_mb=1024 * n)
        async with running(Engine(s, make_driver("process", s))) as e:
            for _ in range(n):
                req = CreateMachine.model_validate(
                    {"app": "bench", "config": {"init": {"exec": ["sleep", "60"]}}}
                )
                t0 = time.perf_counter()
                m = await e.create(req)
                await e.wait(m.id, "started", 30, None)
                times.append((time.perf_counter() - t0) * 1000)
            await destroy_all(e)
    return times


class View:
    """A catalog of `count` started machines over 100 apps, as a replica would hold them."""

    def __init__(self, count: int) -> None:
        net = addresses.worker_prefix(CLUSTER, DEFAULT_NETWORK, "w1")
        self.rows: dict[str, list[MachineRow]] = {}
        for i in range(count):
            app = f"app{i % 100}"
            row = MachineRow(
                id=f"m{i:08d}",
                app=app,
                region="mad",
                worker_id="w1",
                state="started",
                instance_id="i",
                cpu_kind="shared",
                cpus=1,
                memory_mb=256,
                private_ip=str(net[i + 2]),
                updated_at="2026-01-01T00:00:00Z",
            )
            self.rows.setdefault(app, []).append(row)

    def machines(self, app: str | None = None, region: str | None = None) -> list[MachineRow]:
        if app is None:
            return [r for rows in self.rows.values() for r in rows]
        return list(self.rows.get(app, []))


async def dns_times(questions: int, machines: int) -> tuple[list[float], list[float]]:
    """(DNS answer round trips, UDP echo round trips), in ms, on ::1."""
    names = dns.Names(View(machines), "mad", CLUSTER)
    port = 53053
    close = await dns.serve(names, "::1", port)
    loop = asyncio.get_running_loop()

    class Echo(asyncio.DatagramProtocol):
        def connection_made(self, transport: asyncio.BaseTransport) -> None:
            self.transport = transport

        def datagram_received(self, data: bytes, addr: Any) -> None:
            self.transport.sendto(data, addr)  # type: ignore[attr-defined]

    echo, _ = await loop.create_datagram_endpoint(Echo, local_addr=("::1", port + 1))
    try:
        from dnslib import DNSRecord

        query = DNSRecord.question("app7.internal", "AAAA").pack()

        def rounds(to: int) -> list[float]:
            out = []
            with socket.socket(socket.AF_INET6, socket.SOCK_DGRAM) as s:
                s.connect(("::1", to))
                for _ in range(questions):
                    t0 = time.perf_counter()
                    s.send(query)
                    s.recv(4096)
                    out.append((time.perf_counter() - t0) * 1000)
            return out

        answered = await asyncio.to_thread(rounds, port)
        echoed = await asyncio.to_thread(rounds, port + 1)
        return answered, echoed
    finally:
        close()
        echo.close()


def row(what: str, xs: list[float], ratio: float | None = None) -> Row:
    return Row(what, len(xs), pct(xs, 50), pct(xs, 90), ratio)


async def run(args: argparse.Namespace) -> list[Row]:
    own: list[float] = []
    shared: list[float] = []
    with tempfile.TemporaryDirectory() as tmp:
        for r in range(args.rounds):
            order = (False, True) if r % 2 == 0 else (True, False)
            for is_shared in order:
                got = await starts(Path(tmp) / f"r{r}{int(is_shared)}", args.starts, is_shared)
                (shared if is_shared else own).extend(got)
    answered, echoed = await dns_times(args.questions, args.machines)
    return [
        row("start, host's network (loopback address)", shared),
        row("start, own namespace", own, statistics.median(own) / statistics.median(shared)),
        row("UDP echo on ::1", echoed),
        row(
            f"DNS <app>.internal ({args.machines} machines)",
            answered,
            statistics.median(answered) / statistics.median(echoed),
        ),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--starts", type=int, default=40, help="machines per arm and round")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--questions", type=int, default=2000)
    parser.add_argument("--machines", type=int, default=2000)
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/network.py makes network namespaces: run it as root")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)  # in a namespace of its own
    rows = asyncio.run(run(args))
    table = Table(title="The private network")
    for name in ("what", "n", "p50 ms", "p90 ms", "ratio"):
        table.add_column(name)
    for r in rows:
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else ""
        table.add_row(r.what, str(r.n), f"{r.p50_ms:.2f}", f"{r.p90_ms:.2f}", ratio)
    report(rows, table, args.json)


if __name__ == "__main__":
    main()
