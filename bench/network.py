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
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
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
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.machines import addresses
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
                times.append(time.perf_counter() - t0)
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
    """(DNS answer round trips, UDP echo round trips), in seconds, on ::1."""
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
                    out.append(time.perf_counter() - t0)
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
    parser.add_argument("--rounds-rtt", type=int, default=2000, help="round trips per round")
    parser.add_argument("--megabytes", type=int, default=200, help="sent per round")
    parser.add_argument("--new-machines", type=int, default=5)
    parser.add_argument("--only", choices=["host", "across"], default=None)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("bench/network.py makes network namespaces: run it as root")
    subprocess.run(["ip", "link", "set", "lo", "up"], check=False)  # in a namespace of its own
    rows: list[Row] = []
    if args.only != "across":
        rows += asyncio.run(run(args))
    if args.only != "host":
        with tempfile.TemporaryDirectory() as tmp:
            rows += across(args, Path(tmp))
    table = Table(title="The private network")
    for name in ("what", "n", "p50 ms", "p90 ms", "ratio"):
        table.add_column(name)
    for r in rows:
        ratio = f"{r.ratio:.2f}x" if r.ratio is not None else ""
        table.add_row(r.what, str(r.n), f"{r.p50_ms:.2f}", f"{r.p90_ms:.2f}", ratio)
    report(rows, table, args.json)


# --- across two hosts: over the mesh, against the bare link -----------------------------------

SERVERS = """
import socket, threading
def echo(c):
    while data := c.recv(65536):
        c.sendall(data)
def sink(c):
    while c.recv(1 << 20):
        pass
    c.close()
def serve(port, fn):
    s = socket.socket(socket.AF_INET6); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    s.bind(("::", port)); s.listen(64)
    while True:
        c, _ = s.accept(); c.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        threading.Thread(target=fn, args=(c,), daemon=True).start()
threading.Thread(target=serve, args=(9001, sink), daemon=True).start()
serve(9000, echo)
"""

# `client HOST ROUNDS MEGABYTES`: the median round trip (ms) of a 64-byte message, then MB/s
CLIENT = """
import socket, statistics, sys, time
host, rounds, mb = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
s = socket.create_connection((host, 9000)); s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
times = []
for _ in range(rounds):
    t0 = time.perf_counter(); s.sendall(b"x" * 64); got = 0
    while got < 64:
        got += len(s.recv(64 - got))
    times.append((time.perf_counter() - t0) * 1000)
t = socket.create_connection((host, 9001)); block = b"x" * (1 << 20)
t0 = time.perf_counter()
for _ in range(mb):
    t.sendall(block)
t.shutdown(socket.SHUT_WR); t.recv(1); elapsed = time.perf_counter() - t0
print(statistics.median(times), mb / elapsed)
"""

# `watch NAME`: polls NAME:9000 until the machine answers (a connection accepted, or refused
# by its kernel before its app listens: either way the route works); prints the wall times of
# the first answer with an address, and of the machine's first answer
WATCH = """
import socket, sys, time
named = None
while True:
    try:
        addr = socket.getaddrinfo(sys.argv[1], 9000, socket.AF_INET6, socket.SOCK_STREAM)[0][4]
        named = named or time.time()
        socket.create_connection(addr[:2], timeout=0.2).close()
    except ConnectionRefusedError:
        pass
    except OSError:
        time.sleep(0.002)
        continue
    print(named, time.time())
    break
"""


def across(args: argparse.Namespace, tmp: Path) -> list[Row]:
    """Two hosts as `tests/network/two_hosts.py` makes them, workers on the mesh."""
    from tests.network import two_hosts as bed

    b = f"skn{os.getpid()}-b"
    parts: list[subprocess.Popen[bytes]] = []
    rows: list[Row] = []
    try:
        bed.make_hosts(b)
        nats = [shutil.which("nats-server") or "nats-server", "-a", bed.A, "-p", str(bed.NATS)]
        parts.append(subprocess.Popen(nats, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        parts.append(bed.worker(tmp, "wa", bed.A, None))
        parts.append(bed.worker(tmp, "wb", bed.B, b))
        for host in (bed.A, bed.B):
            bed.until(f"worker {host}", lambda h=host: bed.call(h, "GET", "/v1/machines") == [])
        servers = [sys.executable, "-c", SERVERS]

        def create(host: str, app: str) -> dict[str, Any]:
            body = {"app": app, "config": {"init": {"exec": servers}}}
            made: dict[str, Any] = bed.call(host, "POST", "/v1/machines", body)
            bed.call(host, "GET", f"/v1/machines/{made['id']}/wait?state=started&timeout=30")
            return made

        a1, b1 = create(bed.A, "bench"), create(bed.B, "bench")
        # the bare link: the same servers on host B's own address, the client on host A's
        bare_server = subprocess.Popen(["ip", "netns", "exec", b, *servers])
        client = [sys.executable, "-c", CLIENT]
        wanted = [str(args.rounds_rtt), str(args.megabytes)]
        bed.until(
            "the mesh", lambda: bed.run_in(bed.A, a1["id"], [*client, b1["private_ip"], "1", "1"])
        )
        mesh_rtt, mesh_tp = [], []
        bare_rtt, bare_tp = [], []
        for _ in range(args.rounds):
            out = bed.run_in(bed.A, a1["id"], [*client, b1["private_ip"], *wanted]).split()
            mesh_rtt.append(float(out[0]) / 1000)  # the client says ms
            mesh_tp.append(float(out[1]))
            done = subprocess.run([*client, bed.B, *wanted], capture_output=True, text=True)
            bare = done.stdout.split()
            bare_rtt.append(float(bare[0]) / 1000)
            bare_tp.append(float(bare[1]))
        bare_server.kill()
        bare_server.wait()
        rows += [
            row("round trip, bare link (host to host)", bare_rtt),
            row("round trip, machine to machine over the mesh", mesh_rtt,
                statistics.median(mesh_rtt) / statistics.median(bare_rtt)),
            Row("throughput MB/s, bare link", len(bare_tp), statistics.median(bare_tp), 0.0),
            Row("throughput MB/s, over the mesh", len(mesh_tp), statistics.median(mesh_tp), 0.0,
                statistics.median(mesh_tp) / statistics.median(bare_tp)),
        ]  # fmt: skip
        # a new machine on B: from `started` to reachable by name from a machine on A
        reached: list[float] = []
        named: list[float] = []
        for i in range(args.new_machines):
            seen: list[str] = []
            name = f"late{i}"
            watch = [sys.executable, "-c", WATCH, f"{name}.internal"]
            watcher = threading.Thread(
                target=lambda out=seen, argv=watch: out.append(bed.run_in(bed.A, a1["id"], argv))
            )
            watcher.start()
            time.sleep(0.3)  # the watcher polls before the machine exists
            made = create(bed.B, name)
            started = time.time()
            watcher.join()
            named_at, reached_at = (float(t) for t in seen[0].split())
            named.append(named_at - started)
            reached.append(reached_at - started)
            del made
        rows.append(row("new machine: started to its name answered on another host", named))
        rows.append(row("new machine: started to answering by name on another host", reached))
        return rows
    finally:
        bed.destroy_all()
        bed.teardown(parts, (b, "wb"))


if __name__ == "__main__":
    main()
