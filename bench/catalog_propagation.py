"""Catalog propagation: how long from an owner's commit until a replica in another process has
applied it, over a real `nats-server`, with 100 and 1,000 owners (`--owners 100,1000,10000` adds
10,000); next to bare NATS between nats-py connections, with the same message size, in the same
run; `--plot DIR` draws the latency against the fleet's size.

Owners are `SimRows` + `Owner` (heartbeat every second, as in production), all in this process
on one NATS connection, started over one second so that their heartbeats are spread as a real
fleet's would be, over a few regions; once started, their state is frozen and the collector off
(thousands of owners in one heap would otherwise pause together, as no real fleet does). Each
replica is `souk.catalog.replica` following every region, with its SQLite copy in a file, in its
own process (this script again) on its own connection. A change is one machine row updated on a
random owner: its `updated_at` carries the wall-clock time of the commit, and the replica notes
when its subscription yields the row (same host, same clock): the latency is commit → visible to
a reader of the replica. The owner's `encode` and the replica's `decode_batch` are wrapped (here,
not in the catalog) to split it into commit → sent, → received, → visible.

Per phase (fleet size, total change rate, replicas) it reports p50/p99/max latency, messages and
bytes per change (counted at the owners, and at the server from its /varz), the heartbeat load,
garbage-collector pauses, and the CPU of the replica, the owners, nats-server, the rest of the
host and the hypervisor's steal. The floors: one message at a time between two connections, and
a steady stream at each rate from this process to another (no catalog). A replica calls
`heap.settle` once it holds every owner's rows, as a souk part does once it is ready;
`--replica-gc default` leaves it Python's default collector instead.

With `--secure`, each fleet size is measured three times in the same run: plain, signed (every
owner signs with its own Ed25519 key, the replica checks against a CA) and signed over TLS (a
second nats-server configured as `souk nats config` makes it: mutual TLS, users mapped from
certificates, permissions; the owners share one connection and one certificate, here); a last
table gives each secured phase's p50, p99 and CPU over the plain one's.

With `--replay`, no NATS and no other process: the owners' messages are recorded in process, then
handed one at a time to three fresh replicas, plain, signed, and signed on a bus that vouches for
who published on an owner's subject (as the authenticated bus does: "signed+tls"), which take
turns (a slice of the batches, then of the heartbeats, each), so that the host's other work
falls on all three alike; it reports the replica's CPU time and wall-clock time per batch and per
heartbeat, and per message as the end-to-end phases mix them (2,000 batches a second and one
heartbeat per owner), which a busy shared host blurs far less than the end-to-end runs.

Usage: .venv/bin/python bench/catalog_propagation.py [--owners 100,1000] [--rates 500,2000]
       [--seconds 20] [--quick] [--json] [--profile-replica FILE] [--keep DIR] [--secure]
       [--modes plain,signed,signed+tls] [--replica-gc settle|default]
       .venv/bin/python bench/catalog_propagation.py --replay [--owners 1000]
       [--replay-changes 10000] [--replay-beats 10] [--profile-replica FILE]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import cProfile
import gc
import json
import os
import pstats
import random
import shutil
import subprocess
import sys
import tempfile
import time
from array import array
from collections.abc import AsyncIterator, Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from rich.console import Console
from rich.progress import BarColumn, Progress, TaskID, TextColumn, TimeElapsedColumn
from rich.table import Table

from _harness import GcPauses, Pki, Series, chart, machine_info, pct

from souk import heap
from souk.catalog import owner as owner_module
from souk.catalog.bus import Handler, InProcessBus, Message, NatsBus, Subscription
from souk.catalog.certs import bus_options
from souk.catalog.owner import Owner
from souk.catalog.permissions import Node
from souk.catalog.protocol import PREFIX, Batch, encode
from souk.catalog.replica import Replica, following
from souk.catalog.sim import SimRows
from souk.catalog.sync import batches as batches_module
from souk.catalog.trust import CaTrust
from souk.commands import ended
from souk.pki import NodeFiles, load_cas
from tests.support.ports import free_port

REGIONS = ["mad", "ams", "ord", "nrt"]
MACHINES_PER_OWNER = 4
APPS = 20
GOAL = "p99 < 10 ms at 1,000 owners, < 100 ms at 10,000"
FLOOR_SAMPLES = 2000


# --- instruments ---------------------------------------------------------------------------------


class Stamps:
    """(commit, then) wall-clock pairs, in two arrays of doubles: a list of tuples would be two
    objects more per change for the collector of the process measuring to walk, and its pauses
    part of what it measures."""

    def __init__(self) -> None:
        self.commit, self.then = array("d"), array("d")

    def note(self, commit: float, then: float) -> None:
        self.commit.append(commit)
        self.then.append(then)

    def __iter__(self) -> Iterator[tuple[float, float]]:
        return zip(self.commit, self.then, strict=True)


def stamp_batches(module: Any, name: str, into: Stamps) -> None:
    """Wraps `module.<name>` (the catalog's `encode` as the owner module uses it, or its
    `decode_batch` as the replica's batches module does) to note (commit time, now) for each
    machine row of each batch: the intermediate stages of the latency, without touching the
    catalog."""
    inner = getattr(module, name)

    def traced(arg: Any) -> Any:
        out = inner(arg)
        batch = out if isinstance(out, Batch) else arg
        if isinstance(batch, Batch):
            now = time.time()
            for change in batch.changes:
                if change.row is not None and "updated_at" in change.row:
                    into.note(float(change.row["updated_at"]), now)
        return out

    setattr(module, name, traced)


# --- nats-server -----------------------------------------------------------------------------


@dataclass
class Server:
    url: str
    monitor: str
    version: str
    pid: int


@contextlib.asynccontextmanager
async def nats_server(workdir: Path, pki: Pki | None = None) -> AsyncIterator[Server]:
    """A nats-server on loopback; with `pki`, the authenticated one (see `bus_config`)."""
    binary = shutil.which("nats-server")
    if binary is None:
        raise SystemExit("nats-server is not installed (Debian: apt-get install nats-server)")
    port, mport = free_port(), free_port()
    argv = [binary, "-a", "127.0.0.1", "-p", str(port), "-m", str(mport)]
    if pki is not None:
        argv = [binary, "-c", str(bus_config(pki, port)), "-m", str(mport)]
    with open(workdir / f"nats-server{'-tls' if pki else ''}.log", "wb") as log:
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log
        )
    monitor = f"http://127.0.0.1:{mport}"
    try:
        version = "?"
        async with aiohttp.ClientSession() as session:
            for _ in range(500):
                if proc.returncode is not None:
                    raise SystemExit(f"nats-server exited: see {workdir / 'nats-server.log'}")
                with contextlib.suppress(aiohttp.ClientError):
                    async with session.get(monitor + "/varz") as resp:
                        version = str((await resp.json())["version"])
                        break
                await asyncio.sleep(0.02)
        yield Server(f"nats://127.0.0.1:{port}", monitor, version, proc.pid)
    finally:
        await ended(proc)


async def varz(session: aiohttp.ClientSession, server: Server) -> dict[str, Any]:
    async with session.get(server.monitor + "/varz") as resp:
        data: dict[str, Any] = await resp.json()
        return data


# --- security: a CA, node certificates, the authenticated bus --------------------------------


@dataclass(frozen=True)
class Mode:
    name: str
    signed: bool = False
    tls: bool = False


PLAIN, SIGNED, SIGNED_TLS = Mode("plain"), Mode("signed", True), Mode("signed+tls", True, True)


def bus_config(pki: Pki, port: int) -> Path:
    """The authenticated bus: two replicas (operators) and, for the owners that share one
    connection here, a user that may speak for all."""
    fleet = {
        "user": "souk://worker/fleet",
        "permissions": {
            "publish": {"allow": [f"{PREFIX}.ch.>", f"{PREFIX}.hb.>"]},
            "subscribe": {
                "allow": [
                    f"{PREFIX}.pull.*",
                    f"{PREFIX}.cert.*",
                    f"{PREFIX}.hello",
                    "_INBOX.worker.fleet.>",
                ]
            },
            "allow_responses": {"max": 1},
        },
    }
    nodes = [Node("operator", f"replica{i}") for i in (1, 2)]
    return pki.bus_config(port, nodes, [fleet])


# --- the owners' side ------------------------------------------------------------------------


class CountingBus(NatsBus):
    """The owners' NatsBus, counting what they publish: batches and heartbeats apart."""

    def __init__(self, inner: NatsBus) -> None:
        super().__init__(inner.nc)
        self.counts: dict[str, list[int]] = {"ch": [0, 0], "hb": [0, 0], "other": [0, 0]}

    async def publish(self, subject: str, data: bytes, reply: str | None = None) -> None:
        kind = subject.split(".")[2] if subject.startswith(PREFIX + ".") else "other"
        held = self.counts.get(kind, self.counts["other"])
        held[0] += 1
        held[1] += len(data)
        await super().publish(subject, data, reply)

    def snapshot(self) -> dict[str, tuple[int, int]]:
        return {k: (v[0], v[1]) for k, v in self.counts.items()}


@dataclass
class Fleet:
    bus: CountingBus
    sources: list[SimRows]
    owners: list[Owner]
    rng: random.Random = field(default_factory=lambda: random.Random(7))

    def change(self) -> None:
        one_change(self.rng, self.sources)


def one_change(rng: random.Random, sources: list[SimRows]) -> None:
    """One committed change: a machine row of a random owner, started or stopped."""
    src = rng.choice(sources)
    slot = rng.randrange(MACHINES_PER_OWNER)
    state = rng.choice(("started", "stopped"))
    src.machine(app_of(src, slot), state=state, key=f"{src.owner}-m{slot}")


def app_of(src: SimRows, slot: int) -> str:
    return f"app{(int(src.owner[1:]) + slot) % APPS}"


@contextlib.asynccontextmanager
async def fleet(
    url: str,
    count: int,
    advance: Callable[[], None],
    freeze: bool,
    mode: Mode = PLAIN,
    pki: Pki | None = None,
) -> AsyncIterator[Fleet]:
    """`count` owners on one connection, started over one second (their heartbeats spread as a
    real fleet's), each with MACHINES_PER_OWNER machines; signed, each with its own key."""
    options = pki.bus_options("worker", "fleet") if mode.tls and pki is not None else {}
    bus = CountingBus(await NatsBus.connect(url, name="bench-owners", **options))
    sources = [SimRows(f"w{i:04d}", REGIONS[i % len(REGIONS)]) for i in range(count)]
    signers = [
        pki.signer("worker", src.owner) if mode.signed and pki is not None else None
        for src in sources
    ]
    owners: list[Owner] = []
    began = time.perf_counter()
    try:
        for i, src in enumerate(sources):
            owner = Owner(bus, src, signer=signers[i])
            src.publisher = owner
            await owner.start()
            owners.append(owner)
            for slot in range(MACHINES_PER_OWNER):
                src.machine(app_of(src, slot), key=f"{src.owner}-m{slot}")
            advance()
            await asyncio.sleep(max(0.0, began + (i + 1) / count - time.perf_counter()))
        if freeze:
            # A real owner is one small process per host; here thousands share one heap, whose
            # collections would stall them all together (at 10,000 owners, 100-300 ms pauses
            # that set the p99 of every change). Their long-lived state is moved out of the
            # collector's reach, and what they churn while driven is left to reference
            # counting, as ten thousand small heaps would have it.
            gc.collect()
            gc.freeze()
            gc.disable()
        yield Fleet(bus, sources, owners)
    finally:
        gc.enable()
        for owner in owners:
            await owner.stop()
        await bus.close()
        gc.unfreeze()


async def drive(fleet: Fleet, rate: float, seconds: float, tick: Callable[[int], None]) -> int:
    """Commits changes at `rate` per second for `seconds`, keeping to the schedule (a late tick
    catches up); returns how many."""
    began = time.perf_counter()
    issued = 0
    while (now := time.perf_counter() - began) < seconds:
        due = int(rate * now)
        while issued < due:
            fleet.change()
            issued += 1
        tick(issued)
        await asyncio.sleep(0.002)
    return issued


# --- a replica process -----------------------------------------------------------------------


async def replica_process(
    url: str,
    workers: int,
    machines: int,
    profile: bool,
    souk_gc: bool,
    out: Path,
    security: list[str],
) -> None:
    """Child process: a replica following every region; prints `ready` once subscribed and
    `converged` once it holds every owner's rows; on EOF on stdin writes its samples to `out`.
    `security`: the CA to check signatures against, and the directory of its own node files
    for TLS ("-" for none). `souk_gc`: `heap.settle` once converged, as a souk part does once
    ready (its replica bootstrapped); else Python's default collector throughout."""
    samples = Stamps()  # (commit, visible) wall-clock times
    received = Stamps()  # (commit, decoded here)
    counters: list[tuple[float, int, int, int, int]] = []  # (wall, gaps, pulls, refused, batches)
    stamp_batches(batches_module, "decode_batch", received)
    pauses = GcPauses()
    profiler = cProfile.Profile() if profile else None
    ca, tls = (None if v == "-" else Path(v) for v in security)
    trust = None if ca is None else CaTrust(load_cas(ca))
    options = {} if tls is None else bus_options(NodeFiles.find(tls))
    bus = await NatsBus.connect(url, name="bench-replica", **options)
    async with following(bus, out.with_suffix(".db"), trust=trust) as replica:

        async def watch() -> None:
            async for rc in replica.subscribe(tables=frozenset({"machines"})):
                if rc.row is not None:
                    samples.note(float(rc.row["updated_at"]), time.time())

        async def sample() -> None:
            while True:
                refused = sum(replica.guard.refused.values())
                stats = replica.stats
                counters.append(
                    (time.time(), stats["gaps"], stats["pulls"], refused, stats["batches"])
                )
                await asyncio.sleep(0.1)

        async def announce() -> None:
            while not (
                len(replica.workers(reachable_only=False)) >= workers
                and len(replica.machines()) >= machines
            ):
                await asyncio.sleep(0.05)
            if souk_gc:
                heap.settle()
            print("converged", flush=True)
            if profiler is not None:
                profiler.enable()

        tasks = [asyncio.create_task(c) for c in (watch(), sample(), announce())]
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(out.with_suffix(".prof"))
        for task in tasks:
            task.cancel()
        stats = dict(replica.stats) | dict(replica.guard.refused)
    await bus.close()
    result = {
        "samples": list(samples),
        "received": list(received),
        "counters": counters,
        "stats": stats,
    }
    out.write_text(json.dumps(result | {"gc": pauses.pauses}))


class Child:
    """This script again, as a replica or a sink: says `ready`, writes `out` at EOF on stdin."""

    def __init__(self, proc: asyncio.subprocess.Process, out: Path) -> None:
        self.proc, self.out = proc, out

    @classmethod
    async def start(cls, role: str, args: list[str], out: Path) -> Child:
        argv = [sys.executable, __file__, role, *args, str(out)]
        proc = await asyncio.create_subprocess_exec(
            *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        child = cls(proc, out)
        await child.expect("ready", 30)
        return child

    @classmethod
    async def replica(
        cls,
        url: str,
        workers: int,
        machines: int,
        out: Path,
        profile: bool,
        security: tuple[str, str] = ("-", "-"),
        souk_gc: bool = True,
    ) -> Child:
        gc_arg = "settle" if souk_gc else "default"
        args = [url, str(workers), str(machines), "1" if profile else "0", gc_arg, *security]
        return await cls.start("--replica-process", args, out)

    async def expect(self, word: str, timeout: float) -> None:
        assert self.proc.stdout is not None
        line = await asyncio.wait_for(self.proc.stdout.readline(), timeout)
        if line.decode().strip() != word:
            raise SystemExit(f"child process: expected {word!r}, got {line!r}")

    async def finish(self) -> Any:
        assert self.proc.stdin is not None
        self.proc.stdin.close()
        await asyncio.wait_for(self.proc.wait(), 60)
        return json.loads(self.out.read_text())

    async def kill(self) -> None:
        if self.proc.returncode is None:
            self.proc.kill()
            await self.proc.wait()


# --- the floor: bare NATS ----------------------------------------------------------------------


async def bare_floor(
    url: str, size: int, samples: int, advance: Callable[[], None]
) -> tuple[list[float], int]:
    """One message at a time from one nats-py connection to another (no flush, as NatsBus):
    publish → received, in seconds; and how many never arrived within a second."""
    import nats

    pub = await nats.connect(url, name="bench-floor-pub")
    sub = await nats.connect(url, name="bench-floor-sub")
    arrived: asyncio.Queue[tuple[int, float]] = asyncio.Queue()

    async def on_msg(msg: Any) -> None:
        arrived.put_nowait((int(msg.data[:12]), time.perf_counter()))

    await sub.subscribe("bench.floor", cb=on_msg)
    await sub.flush()
    latencies: list[float] = []
    lost = 0
    try:
        for i in range(samples + 200):
            sent = time.perf_counter()
            await pub.publish("bench.floor", f"{i:012d}".encode().ljust(size, b"x"))
            try:
                while (got := await asyncio.wait_for(arrived.get(), 1))[0] != i:
                    pass  # a late one, already counted lost
            except TimeoutError:
                lost += 1
                continue
            if i >= 200:  # warm-up
                latencies.append(got[1] - sent)
                advance()
    finally:
        await pub.close()
        await sub.close()
    return latencies, lost


async def sink_process(url: str, out: Path) -> None:
    """Child process: notes (sent, received) wall-clock times of bare messages, stamped by the
    sender, until EOF on stdin."""
    import nats

    got: list[tuple[float, float]] = []
    nc = await nats.connect(url, name="bench-sink")

    async def on_msg(msg: Any) -> None:
        got.append((float(msg.data[:20]), time.time()))

    await nc.subscribe("bench.sink", cb=on_msg)
    await nc.flush()
    print("ready", flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)
    await nc.close()
    out.write_text(json.dumps(got))


@dataclass
class BareRow:
    """Bare NATS across processes at a steady rate: what the host and NATS alone cost."""

    rate: int
    actual_rate: float
    messages: int
    received_pct: float
    p50_ms: float
    p99_ms: float
    max_ms: float
    steal_pct: float


async def bare_at_rate(
    url: str, rate: int, seconds: float, size: int, workdir: Path, progress: Progress
) -> BareRow:
    """Messages of `size` bytes at `rate` per second from this process to a sink process."""
    import nats

    sink = await Child.start("--sink-process", [url], workdir / f"sink-{rate}.json")
    nc = await nats.connect(url, name="bench-bare")
    bar = progress.add_task(f"bare NATS across processes, {rate}/s", total=seconds)
    try:
        steal0, began, sent = host_seconds()[1], time.perf_counter(), 0
        while (now := time.perf_counter() - began) < seconds:
            while sent < int(rate * now):
                await nc.publish("bench.sink", f"{time.time():20.6f}".encode().ljust(size, b"x"))
                sent += 1
            progress.update(bar, completed=now)
            await asyncio.sleep(0.002)
        elapsed, steal = time.perf_counter() - began, host_seconds()[1] - steal0
        await nc.flush()
        await asyncio.sleep(1)
        got = await sink.finish()
    finally:
        await nc.close()
        await sink.kill()
    lat = sorted(b - a for a, b in got)
    return BareRow(
        rate,
        sent / elapsed,
        sent,
        100 * len(lat) / max(sent, 1),
        pct(lat, 50),
        pct(lat, 99),
        lat[-1] * 1000 if lat else 0.0,
        100 * steal / elapsed,
    )


def batch_size() -> int:
    """The encoded size of a one-change batch, the usual message on the wire."""
    src = SimRows("w0001", REGIONS[0])
    change = src.machine(app_of(src, 0), key="w0001-m0")
    return len(encode(Batch(src.owner, src.region, src.epoch, 1, change.seq, [change])))


# --- the run -----------------------------------------------------------------------------------


@dataclass
class Row:
    mode: str  # plain, signed, signed+tls
    owners: int
    replicas: int
    rate: int  # target changes/s, all owners together
    actual_rate: float
    changes: int
    seen_pct: float  # changes seen by the replica (rest: superseded in the same batch, or lost)
    p50_ms: float
    p99_ms: float
    max_ms: float
    p99_vs_floor: float
    msgs_per_change: float  # batches published per change, at the owners
    bytes_per_change: float  # batch bytes published per change, at the owners
    server_in_bytes_per_change: float  # everything into nats-server (incl. heartbeats) / change
    server_out_bytes_per_change: float  # everything out of nats-server (to replicas) / change
    heartbeats_per_s: float
    heartbeat_bytes_per_s: float
    replica_cpu_pct: float  # of one core, the first replica
    replica_cpu_us_per_batch: float  # its CPU time over the batches it applied (beats included)
    replica_cpu_us_per_message: float  # its CPU time over the batches and heartbeats it took
    owners_cpu_pct: float  # of one core, this process (owners and the load driver)
    server_cpu_pct: float  # of one core, nats-server
    others_cpu_pct: float  # of one core, the rest of the host (not this benchmark)
    steal_pct: float  # of one core, taken by the hypervisor from this VM's vCPUs
    gaps: int  # batches the replica received out of order (repaired by pulls)
    pulls: int
    sent_p50_ms: float  # commit → handed to NATS by the owner
    sent_p99_ms: float
    received_p50_ms: float  # commit → decoded by the replica (before applying)
    received_p99_ms: float
    replica_gc_max_ms: float  # the replica's longest garbage-collector pause
    replica_gc_ms_per_s: float
    owners_gc_max_ms: float
    owners_gc_ms_per_s: float
    refused: int = 0  # messages the first replica refused in the window (none is forged here)
    replica_p99_ms: list[float] = field(default_factory=list)  # per replica


@dataclass
class Window:
    rate: int
    replicas: int
    t0: float
    t1: float
    changes: int
    counts0: dict[str, tuple[int, int]]
    counts1: dict[str, tuple[int, int]]
    varz0: dict[str, Any]
    varz1: dict[str, Any]
    cpu0: dict[str, float]
    cpu1: dict[str, float]


TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float:
    """A process's CPU time (user + system) so far."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def host_seconds() -> tuple[float, float]:
    """CPU time all cores of this (virtual) host spent busy so far, and the time the hypervisor
    took from it (steal: its vCPUs wanted to run but another guest ran)."""
    user, nice, system, _idle, _iowait, irq, softirq, steal = (
        int(v) for v in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]
    )
    return (user + nice + system + irq + softirq) / TICK, steal / TICK


def cpu_now(pids: dict[str, int]) -> dict[str, float]:
    times = {name: cpu_seconds(pid) for name, pid in pids.items()}
    times["host"], times["steal"] = host_seconds()
    return times


def counted(samples: list[list[float]], t0: float, t1: float) -> tuple[int, int, int, int]:
    """From a replica's (wall, gaps, pulls, refused, batches) samples: how many of each it had
    within t0..t1."""
    inside = [s for s in samples if t0 <= s[0] <= t1]
    if len(inside) < 2:
        return 0, 0, 0, 0
    first, last = inside[0], inside[-1]
    gaps, pulls, refused, batches = (int(b - a) for a, b in zip(first[1:], last[1:], strict=True))
    return gaps, pulls, refused, batches


def stage(stamps: Iterable[Sequence[float]], t0: float, t1: float) -> list[float]:
    """Delays (seconds) of the stamped changes committed within t0..t1, sorted."""
    return sorted(b - a for a, b in stamps if t0 <= a < t1)


def gc_in(pauses: Sequence[Sequence[float]], t0: float, t1: float) -> tuple[float, float]:
    """The longest pause and the pause time per second (both ms) within t0..t1."""
    inside = [p for end, p in pauses if t0 <= end < t1]
    return max(inside, default=0.0) * 1000, sum(inside) * 1000 / (t1 - t0)


def summarize(
    mode: Mode,
    w: Window,
    owners: int,
    results: list[dict[str, Any]],
    floor_p99: float,
    sent: Stamps,
    owner_pauses: list[tuple[float, float]],
) -> Row:
    per_replica = [stage(result["samples"], w.t0, w.t1) for result in results[: w.replicas]]
    to_wire = stage(sent, w.t0, w.t1)
    to_replica = stage(results[0]["received"], w.t0, w.t1)
    replica_gc = gc_in(results[0]["gc"], w.t0, w.t1)
    owners_gc = gc_in(owner_pauses, w.t0, w.t1)
    first = per_replica[0]
    seconds = w.t1 - w.t0
    n = max(w.changes, 1)
    ch = [b - a for a, b in zip(w.counts0["ch"], w.counts1["ch"], strict=True)]
    hb = [b - a for a, b in zip(w.counts0["hb"], w.counts1["hb"], strict=True)]
    p99 = pct(first, 99)
    gaps, pulls, refused, batches = counted(results[0]["counters"], w.t0, w.t1)
    cpu = {k: 100 * (w.cpu1[k] - w.cpu0[k]) / seconds for k in w.cpu0}
    ours = cpu["owners"] + cpu["nats"] + sum(v for k, v in cpu.items() if k.startswith("replica"))
    return Row(
        mode=mode.name,
        owners=owners,
        replicas=w.replicas,
        rate=w.rate,
        actual_rate=w.changes / seconds,
        changes=w.changes,
        seen_pct=100 * len(first) / n,
        p50_ms=pct(first, 50),
        p99_ms=p99,
        max_ms=first[-1] * 1000 if first else 0.0,
        p99_vs_floor=p99 / floor_p99 if floor_p99 else 0.0,
        msgs_per_change=ch[0] / n,
        bytes_per_change=ch[1] / n,
        server_in_bytes_per_change=(w.varz1["in_bytes"] - w.varz0["in_bytes"]) / n,
        server_out_bytes_per_change=(w.varz1["out_bytes"] - w.varz0["out_bytes"]) / n,
        heartbeats_per_s=hb[0] / seconds,
        heartbeat_bytes_per_s=hb[1] / seconds,
        replica_cpu_pct=cpu["replica1"],
        replica_cpu_us_per_batch=1e4 * cpu["replica1"] * seconds / max(batches, 1),
        replica_cpu_us_per_message=1e4 * cpu["replica1"] * seconds / max(batches + hb[0], 1),
        owners_cpu_pct=cpu["owners"],
        server_cpu_pct=cpu["nats"],
        others_cpu_pct=max(0.0, cpu["host"] - ours),
        steal_pct=cpu["steal"],
        gaps=gaps,
        pulls=pulls,
        sent_p50_ms=pct(to_wire, 50),
        sent_p99_ms=pct(to_wire, 99),
        received_p50_ms=pct(to_replica, 50),
        received_p99_ms=pct(to_replica, 99),
        replica_gc_max_ms=replica_gc[0],
        replica_gc_ms_per_s=replica_gc[1],
        owners_gc_max_ms=owners_gc[0],
        owners_gc_ms_per_s=owners_gc[1],
        refused=refused,
        replica_p99_ms=[pct(lat, 99) for lat in per_replica],
    )


async def measure_fleet(
    server: Server,
    owners: int,
    phases: list[tuple[int, int]],
    seconds: float,
    warmup: float,
    floor_p99: float,
    workdir: Path,
    profile: Path | None,
    progress: Progress,
    sent: Stamps,
    pauses: GcPauses,
    freeze: bool,
    mode: Mode = PLAIN,
    pki: Pki | None = None,
    souk_gc: bool = True,
) -> list[Row]:
    """One fleet of `owners`, then each (rate, replicas) phase in turn while heartbeats flow."""
    machines = owners * MACHINES_PER_OWNER
    converge_s = max(120.0, owners / 25)  # a crowded host starts 10,000 signing owners slowly
    replicas: list[Child] = []
    windows: list[Window] = []

    def security(n: int) -> tuple[str, str]:
        if not mode.signed or pki is None:
            return ("-", "-")
        if not mode.tls:
            return (str(pki.ca_path), "-")
        return (str(pki.ca_path), str(pki.files("operator", f"replica{n}").cert.parent))

    def out(n: int) -> Path:
        return workdir / f"r{n}-{owners}-{mode.name}.json"

    try:
        replicas.append(
            await Child.replica(
                server.url, owners, machines, out(1), profile is not None, security(1), souk_gc
            )
        )
        task = progress.add_task(f"{owners} owners, {mode.name}: starting", total=owners)
        async with (
            fleet(server.url, owners, lambda: progress.advance(task), freeze, mode, pki) as f,
            aiohttp.ClientSession() as http,
        ):
            await replicas[0].expect("converged", converge_s)
            progress.update(task, description=f"{owners} owners: started, replica converged")
            for rate, want in phases:
                while len(replicas) < want:
                    n = len(replicas) + 1
                    replicas.append(
                        await Child.replica(
                            server.url, owners, machines, out(n), False, security(n), souk_gc
                        )
                    )
                    await replicas[-1].expect("converged", converge_s)
                plural = "s" if want > 1 else ""
                label = f"{owners} owners, {mode.name}, {rate}/s, {want} replica{plural}"
                bar = progress.add_task(label, total=warmup + seconds)
                began = time.perf_counter()

                def tick(issued: int, bar: TaskID = bar, began: float = began) -> None:
                    progress.update(bar, completed=time.perf_counter() - began)

                await drive(f, rate, warmup, tick)
                pids = {"owners": os.getpid(), "nats": server.pid}
                pids |= {f"replica{i + 1}": r.proc.pid for i, r in enumerate(replicas)}
                v0, c0 = await varz(http, server), f.bus.snapshot()
                cpu0, t0 = cpu_now(pids), time.time()
                changes = await drive(f, rate, seconds, tick)
                cpu1, t1 = cpu_now(pids), time.time()
                v1, c1 = await varz(http, server), f.bus.snapshot()
                windows.append(Window(rate, want, t0, t1, changes, c0, c1, v0, v1, cpu0, cpu1))
                progress.update(bar, completed=warmup + seconds)
            await asyncio.sleep(1.5)  # the last changes of the last window arrive
            results = [await r.finish() for r in replicas]
    finally:
        for r in replicas:
            await r.kill()
    rows = [summarize(mode, w, owners, results, floor_p99, sent, pauses.pauses) for w in windows]
    if profile is not None:
        prof = out(1).with_suffix(".prof")
        suffix = profile.suffix or ".prof"
        target = profile.with_name(f"{profile.stem}-{owners}-{mode.name}{suffix}")
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(prof, target)
    return rows


@dataclass
class Report:
    command: str
    machine: str
    nats_server: str
    message_bytes: int
    floor_p50_ms: float
    floor_p99_ms: float
    floor_max_ms: float
    floor_lost: int
    bare: list[BareRow]
    rows: list[Row]


async def measure(args: argparse.Namespace, progress: Progress) -> Report:
    size = batch_size()
    with tempfile.TemporaryDirectory(prefix="souk-bench-") as tmp:
        workdir = Path(tmp) if args.keep is None else args.keep
        workdir.mkdir(parents=True, exist_ok=True)
        modes = [PLAIN, SIGNED] + ([SIGNED_TLS] if args.tls else []) if args.secure else [PLAIN]
        if args.modes is not None:
            modes = [m for m in modes if m.name in args.modes]
        pki = Pki(workdir) if args.secure else None
        async with contextlib.AsyncExitStack() as stack:
            server = await stack.enter_async_context(nats_server(workdir))
            servers = {mode.name: server for mode in modes}
            if SIGNED_TLS in modes:
                tls = await stack.enter_async_context(nats_server(workdir, pki))
                servers[SIGNED_TLS.name] = tls
            task = progress.add_task(f"bare NATS, {size} B messages", total=FLOOR_SAMPLES)
            floor, floor_lost = await bare_floor(
                server.url, size, FLOOR_SAMPLES, lambda: progress.advance(task)
            )
            floor_p99 = pct(floor, 99)
            bare = [
                await bare_at_rate(server.url, rate, args.seconds, size, workdir, progress)
                for rate in args.rates
            ]
            sent = Stamps()  # (commit, handed to NATS), at the owners
            stamp_batches(owner_module, "encode", sent)
            pauses = GcPauses()
            rows: list[Row] = []
            phases = [(rate, 1) for rate in args.rates]
            if args.second_replica:
                phases.append((max(args.rates), 2))
            for owners in args.owners:
                for mode in modes:
                    rows += await measure_fleet(
                        servers[mode.name],
                        owners,
                        phases,
                        args.seconds,
                        args.warmup,
                        floor_p99,
                        workdir,
                        args.profile_replica,
                        progress,
                        sent,
                        pauses,
                        args.freeze_owners,
                        mode,
                        pki,
                        args.replica_gc == "settle",
                    )
    return Report(
        " ".join(["bench/catalog_propagation.py", *sys.argv[1:]]),
        machine_info(),
        server.version,
        size,
        pct(floor, 50),
        floor_p99,
        max(floor) * 1000,
        floor_lost,
        bare,
        rows,
    )


def tables(report: Report) -> list[Table]:
    secure = any(r.mode != PLAIN.name for r in report.rows)

    def who(r: Row) -> str:
        return f"{r.owners:,} {r.mode}" if secure else f"{r.owners:,}"

    lat = Table(
        title=(
            f"commit → visible on a replica (goal: {GOAL}); "
            f"bare NATS, one at a time: p50 {report.floor_p50_ms:.2f} ms, "
            f"p99 {report.floor_p99_ms:.2f} ms ({report.message_bytes} B"
            f"{f', {report.floor_lost} lost' if report.floor_lost else ''})"
        )
    )
    names = ["owners", "replicas", "changes/s", "changes", "seen %", "p50 ms", "p99 ms", "max ms"]
    for name in [*names, "p99 / bare p99", "gaps", "pulls"]:
        lat.add_column(name, justify="right")
    for r in report.rows:
        p99 = " / ".join(f"{x:.1f}" for x in r.replica_p99_ms)
        lat.add_row(
            who(r),
            str(r.replicas),
            f"{r.actual_rate:,.0f}",
            f"{r.changes:,}",
            f"{r.seen_pct:.1f}",
            f"{r.p50_ms:.1f}",
            p99,
            f"{r.max_ms:.1f}",
            f"{r.p99_vs_floor:.0f}x",
            str(r.gaps),
            str(r.pulls),
        )
    load = Table(title="load: wire per change, heartbeats, CPU (% of one core)")
    for name in (
        "owners",
        "replicas",
        "changes/s",
        "msgs/change",
        "B/change",
        "server in B/change",
        "server out B/change",
        "heartbeats/s",
        "heartbeat kB/s",
        "replica CPU",
        "replica µs/batch",
        "replica µs/message",
        "owners CPU",
        "nats-server CPU",
        "rest of host CPU",
        "steal",
    ):
        load.add_column(name, justify="right")
    for r in report.rows:
        load.add_row(
            who(r),
            str(r.replicas),
            f"{r.actual_rate:,.0f}",
            f"{r.msgs_per_change:.2f}",
            f"{r.bytes_per_change:.0f}",
            f"{r.server_in_bytes_per_change:.0f}",
            f"{r.server_out_bytes_per_change:.0f}",
            f"{r.heartbeats_per_s:,.0f}",
            f"{r.heartbeat_bytes_per_s / 1000:.0f}",
            f"{r.replica_cpu_pct:.0f}%",
            f"{r.replica_cpu_us_per_batch:.0f}",
            f"{r.replica_cpu_us_per_message:.1f}",
            f"{r.owners_cpu_pct:.0f}%",
            f"{r.server_cpu_pct:.0f}%",
            f"{r.others_cpu_pct:.0f}%",
            f"{r.steal_pct:.0f}%",
        )
    where = Table(title="where the time goes (first replica): commit → stage, ms")
    for name in (
        "owners",
        "replicas",
        "changes/s",
        "sent p50",
        "sent p99",
        "received p50",
        "received p99",
        "visible p50",
        "visible p99",
        "replica GC max",
        "replica GC ms/s",
        "owners GC max",
        "owners GC ms/s",
    ):
        where.add_column(name, justify="right")
    for r in report.rows:
        where.add_row(
            who(r),
            str(r.replicas),
            f"{r.actual_rate:,.0f}",
            *(
                f"{x:.1f}"
                for x in (
                    r.sent_p50_ms,
                    r.sent_p99_ms,
                    r.received_p50_ms,
                    r.received_p99_ms,
                    r.p50_ms,
                    r.p99_ms,
                    r.replica_gc_max_ms,
                    r.replica_gc_ms_per_s,
                    r.owners_gc_max_ms,
                    r.owners_gc_ms_per_s,
                )
            ),
        )
    bare = Table(title="bare NATS across processes at the same rates (no catalog): host + NATS")
    for name in ("msgs/s", "messages", "received %", "p50 ms", "p99 ms", "max ms", "steal"):
        bare.add_column(name, justify="right")
    for b in report.bare:
        bare.add_row(
            f"{b.actual_rate:,.0f}",
            f"{b.messages:,}",
            f"{b.received_pct:.1f}",
            f"{b.p50_ms:.2f}",
            f"{b.p99_ms:.2f}",
            f"{b.max_ms:.1f}",
            f"{b.steal_pct:.0f}%",
        )
    return [lat, load, where, bare, *([security_cost(report)] if secure else [])]


def plot(report: Report, into: Path) -> Path:
    """Commit → visible against the fleet's size, one replica, plain: p50 and p99 per rate."""
    into.mkdir(parents=True, exist_ok=True)
    series: Series = []
    for i, rate in enumerate(sorted({r.rate for r in report.rows})):
        rows = sorted(
            (r for r in report.rows if r.rate == rate and r.replicas == 1 and r.mode == PLAIN.name),
            key=lambda r: r.owners,
        )
        xs = [r.owners for r in rows]
        series.append((f"p99, {rate:,} changes/s", xs, [r.p99_ms for r in rows], f"C{i}o-"))
        series.append((f"p50, {rate:,} changes/s", xs, [r.p50_ms for r in rows], f"C{i}o--"))
    return chart(
        series,
        "owners (workers publishing their rows)",
        "commit → visible on a replica (ms)",
        "Catalog propagation as the fleet grows",
        into / "catalog-propagation.png",
    )


def security_cost(report: Report) -> Table:
    """Each secured phase against the plain one of the same fleet, rate and replicas."""
    plain = {(r.owners, r.replicas, r.rate): r for r in report.rows if r.mode == PLAIN.name}
    table = Table(title="what security costs: secured / plain, same fleet, rate and replicas")
    for name in (
        "owners",
        "mode",
        "replicas",
        "changes/s",
        "p50 ms",
        "p99 ms",
        "replica CPU",
        "replica µs/batch",
        "replica µs/message",
        "owners CPU",
        "nats-server CPU",
        "B/change",
        "refused",
    ):
        table.add_column(name, justify="right")

    def vs(value: float, base: float, unit: str = "") -> str:
        ratio = f" ({value / base:.2f}x)" if base else ""
        return f"{value:.1f}{unit}{ratio}"

    for r in report.rows:
        base = plain.get((r.owners, r.replicas, r.rate))
        if r.mode == PLAIN.name or base is None:
            continue
        table.add_row(
            f"{r.owners:,}",
            r.mode,
            str(r.replicas),
            f"{r.actual_rate:,.0f}",
            vs(r.p50_ms, base.p50_ms),
            vs(r.p99_ms, base.p99_ms),
            vs(r.replica_cpu_pct, base.replica_cpu_pct, "%"),
            vs(r.replica_cpu_us_per_batch, base.replica_cpu_us_per_batch),
            vs(r.replica_cpu_us_per_message, base.replica_cpu_us_per_message),
            vs(r.owners_cpu_pct, base.owners_cpu_pct, "%"),
            vs(r.server_cpu_pct, base.server_cpu_pct, "%"),
            vs(r.bytes_per_change, base.bytes_per_change),
            str(r.refused),
        )
    return table


# --- in-process replay: the replica's CPU per message, without NATS or other processes --------


class RecordingBus(InProcessBus):
    """Keeps every batch and heartbeat published, to hand them to a replica later."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Message] = []

    async def publish(self, subject: str, data: bytes, reply: str | None = None) -> None:
        if subject.startswith((f"{PREFIX}.ch.", f"{PREFIX}.hb.")):
            self.kept.append(Message(subject, data, reply))
        await super().publish(subject, data, reply)

    async def subscribe(self, subject: str, handler: Handler) -> Subscription:
        """None is made: no replica asks the owners anything while they are recorded, and each
        publish would otherwise scan every owner's pull and hello subscriptions (20,000 at
        10,000 owners: the recording did not finish in half an hour)."""
        return Unsubscribed()


class Unsubscribed:
    async def unsubscribe(self) -> None:
        pass


@dataclass
class Recorded:
    start: list[Message]  # each owner's rows and heartbeats as it starts: the fleet, learnt
    batches: list[Message]  # then one change per batch (a few together, now and then)
    beats: list[Message]  # then heartbeats that bring no news


async def record(owners: int, changes: int, pki: Pki | None, beats: int = 4) -> Recorded:
    """What `owners` owners publish (each signing with its own key, given `pki`): their rows and
    a heartbeat with their apps, then `changes` random changes, then `beats` quiet heartbeats
    each."""
    bus = RecordingBus()
    sources: list[SimRows] = []
    started: list[Owner] = []
    for i in range(owners):
        src = SimRows(f"w{i:04d}", REGIONS[i % len(REGIONS)])
        signer = pki.signer("worker", src.owner) if pki is not None else None
        owner = Owner(bus, src, heartbeat_every=3600, signer=signer)
        owner.published = 0  # its first batch carries the worker row it starts with
        src.publisher = owner
        await owner.start()
        owner.committed(src.seq, list(src.rows.values()))
        for slot in range(MACHINES_PER_OWNER):
            src.machine(app_of(src, slot), key=f"{src.owner}-m{slot}")
        sources.append(src)
        started.append(owner)
    await asyncio.sleep(0.1)
    for owner in started:
        await owner.heartbeat()  # with its apps: news, checked by signature
    start = len(bus.kept)
    rng = random.Random(7)
    for _ in range(changes):
        one_change(rng, sources)
        await asyncio.sleep(0)  # its owner publishes it
    await asyncio.sleep(0.1)
    middle = len(bus.kept)
    for _ in range(beats):
        for owner in started:
            await owner.heartbeat()
    for owner in started:
        await owner.stop()
    for sub in list(bus.subscriptions):
        await sub.unsubscribe()
    return Recorded(bus.kept[:start], bus.kept[start:middle], bus.kept[middle:])


@dataclass
class Replayed:
    mode: str
    owners: int
    batches: int
    batch_cpu_us: float  # CPU time over the batches, per batch (commits included)
    batch_p10_us: float  # per batch, wall clock: the least disturbed tenth
    batch_p50_us: float
    beats: int
    beat_cpu_us: float
    beat_p50_us: float
    collector_ms: float = 0.0  # the collector's pauses in this replica's turns, out of its CPU

    def per_message(self, p50: bool) -> float:
        """µs per message as the end-to-end phases mix them: 2,000 batches a second and one
        heartbeat per owner (by the p50s, or by CPU time)."""
        batch, beat = (
            (self.batch_p50_us, self.beat_p50_us) if p50 else (self.batch_cpu_us, self.beat_cpu_us)
        )
        return (REPLAY_BATCHES_PER_S * batch + self.owners * beat) / (
            REPLAY_BATCHES_PER_S + self.owners
        )


REPLAY_BATCHES_PER_S = 2000  # the end-to-end phases' rate, which weighs batches against beats
REPLAY_CHUNKS = 200  # turns per kind of message: each replica is handed a slice in each turn


@dataclass
class Replaying:
    """One mode's replica, handed its recording a slice at a time, in turn with the others."""

    mode: Mode
    rec: Recorded
    replica: Replica
    profiler: cProfile.Profile | None
    times: dict[str, list[float]] = field(default_factory=lambda: {"batches": [], "beats": []})
    cpu: dict[str, float] = field(default_factory=lambda: {"batches": 0.0, "beats": 0.0})
    collected: float = 0.0  # seconds of the collector's, taken out of `cpu`

    async def one(self, msg: Message) -> float:
        began = time.perf_counter()
        if msg.subject.startswith(f"{PREFIX}.ch."):
            await self.replica.batches.on_batch(msg)
        else:
            await self.replica.heartbeats.on_beat(msg)
        self.replica._flush()
        return time.perf_counter() - began

    async def turn(self, kind: str, chunk: int, collector: GcPauses) -> None:
        """The `chunk`-th slice of this replica's batches or beats, timed. The replicas share
        one heap, so a collection falls in whichever replica's turn is running when the
        allocations of all three trip it (one young collection took 30 to 80 ms here: 3 to 8 µs
        on each of a mode's 10,000 batches): the `collector`'s CPU time is taken out of it."""
        msgs: list[Message] = getattr(self.rec, kind)
        part = msgs[chunk * len(msgs) // REPLAY_CHUNKS : (chunk + 1) * len(msgs) // REPLAY_CHUNKS]
        if self.profiler is not None:
            self.profiler.enable()
        cpu, collected = time.process_time(), collector.total
        self.times[kind].extend([await self.one(msg) for msg in part])
        collected = collector.total - collected
        self.cpu[kind] += time.process_time() - cpu - collected
        self.collected += collected
        if self.profiler is not None:
            self.profiler.disable()

    def result(self, owners: int) -> Replayed:
        replica = self.replica
        if sum(replica.guard.refused.values()) or replica.stats["gaps"]:
            refused = replica.status()["refused"]
            raise SystemExit(f"the {self.mode.name} replay went wrong: {refused}, {replica.stats}")
        batches, beats = sorted(self.times["batches"]), sorted(self.times["beats"])
        return Replayed(
            self.mode.name,
            owners,
            len(batches),
            1e6 * self.cpu["batches"] / len(batches),
            1e6 * batches[len(batches) // 10],
            1e6 * batches[len(batches) // 2],
            len(beats),
            1e6 * self.cpu["beats"] / len(beats),
            1e6 * beats[len(beats) // 2],
            1e3 * self.collected,
        )


async def replay(
    recs: dict[str, Recorded],
    owners: int,
    pki: Pki,
    workdir: Path,
    profile: Path | None,
    settle: bool,
) -> list[Replayed]:
    """A fresh replica per mode (SQLite in a file, as in production), each handed the fleet's
    start, then the recorded batches and then the quiet heartbeats directly, one at a time,
    each committed at once: in turns of a slice each, the modes in rotating order, so that
    whatever else the host does falls on all of them alike. "signed+tls": its bus vouches for
    who published on an owner's subject, as the authenticated bus does (live batches
    audited)."""
    runs = []
    for mode in (PLAIN, SIGNED, SIGNED_TLS):
        path = workdir / f"replay-{owners}-{mode.name}.db"
        path.unlink(missing_ok=True)
        trust = CaTrust([pki.ca.cert]) if mode.signed else None
        replica = Replica(InProcessBus(authenticated=mode.tls), path, trust=trust)
        await replica.start(bootstrap=False)
        profiler = cProfile.Profile() if profile is not None else None
        run = Replaying(mode, recs["signed" if mode.signed else "plain"], replica, profiler)
        for msg in run.rec.start:
            await run.one(msg)
        runs.append(run)
    if settle:
        heap.settle()  # as a souk part does once it is ready
    collector = GcPauses(time.process_time)
    try:
        for kind in ("batches", "beats"):
            for chunk in range(REPLAY_CHUNKS):
                first = chunk % len(runs)
                for run in runs[first:] + runs[:first]:
                    await run.turn(kind, chunk, collector)
    finally:
        collector.stop()
    results = []
    for run in runs:
        results.append(run.result(owners))
        await run.replica.stop()
        if run.profiler is not None and profile is not None:
            name = f"{profile.stem}-replay-{owners}-{run.mode.name}.prof"
            run.profiler.dump_stats(profile.with_name(name))
    return results


async def measure_replay(args: argparse.Namespace) -> list[Replayed]:
    with tempfile.TemporaryDirectory(prefix="souk-bench-") as tmp:
        workdir = Path(tmp) if args.keep is None else args.keep
        workdir.mkdir(parents=True, exist_ok=True)
        pki = Pki(workdir)
        results = []
        for owners in args.owners:
            recs = {
                "plain": await record(owners, args.replay_changes, None, args.replay_beats),
                "signed": await record(owners, args.replay_changes, pki, args.replay_beats),
            }
            settle = args.replica_gc == "settle"
            results += await replay(recs, owners, pki, workdir, args.profile_replica, settle)
    return results


def replay_table(results: list[Replayed]) -> Table:
    table = Table(title="the replica alone, messages handed over in process: µs per message")
    for name in (
        "owners",
        "mode",
        "batches",
        "CPU/batch",
        "p10 batch",
        "p50 batch",
        "beats",
        "CPU/beat",
        "p50 beat",
        "per message, p50s",
        "per message, CPU",
        "collector ms",
    ):
        table.add_column(name, justify="right")
    plain = {r.owners: r for r in results if r.mode == PLAIN.name}
    for r in results:
        base = plain[r.owners]
        pairs = [
            (r.batch_cpu_us, base.batch_cpu_us),
            (r.batch_p10_us, base.batch_p10_us),
            (r.batch_p50_us, base.batch_p50_us),
            (r.beat_cpu_us, base.beat_cpu_us),
            (r.beat_p50_us, base.beat_p50_us),
            (r.per_message(p50=True), base.per_message(p50=True)),
            (r.per_message(p50=False), base.per_message(p50=False)),
        ]
        cells = [f"{v:.1f}" if r is base else f"{v:.1f} ({v / b:.2f}x)" for v, b in pairs]
        table.add_row(
            f"{r.owners:,}",
            r.mode,
            f"{r.batches:,}",
            *cells[:3],
            f"{r.beats:,}",
            *cells[3:],
            f"{r.collector_ms:.0f}",
        )
    table.caption = (
        f"per message: {REPLAY_BATCHES_PER_S:,} batches a second and one heartbeat per owner,"
        " as the end-to-end phases mix them; the modes take turns, a slice of each at a time;"
        " CPU: the collector's pauses taken out (the modes share a heap, and a collection falls"
        " in whichever turn trips it), shown apart"
    )
    return table


def per_message(stats: pstats.Stats) -> str:
    """What one batch and one heartbeat cost the replica, and how much of a batch the signature
    checks are (theirs per batch: the few of heartbeats included)."""
    wanted = {
        (os.path.join("catalog", "sync", "batches.py"), "on_batch"),
        (os.path.join("catalog", "sync", "heartbeats.py"), "on_beat"),
        (os.path.join("catalog", "signing.py"), "verify"),
    }
    found: dict[str, tuple[int, float]] = {}
    entries = stats.stats.items()  # type: ignore[attr-defined]
    for (file, _, func), (_, calls, _, cumulative, _) in entries:
        if any(file.endswith(where) and func == name for where, name in wanted):
            found[func] = (calls, cumulative)
    batches, batch_s = found.get("on_batch", (0, 0.0))
    beats, beat_s = found.get("on_beat", (0, 0.0))
    if not batches:
        return "no batches"
    verify_us = 1e6 * found.get("verify", (0, 0.0))[1] / batches
    batch_us = 1e6 * batch_s / batches
    beat_us = 1e6 * beat_s / beats if beats else 0.0
    return (
        f"{batches:,} batches: {batch_us:.1f} µs each, signature checks {verify_us:.1f} µs, "
        f"the rest {batch_us - verify_us:.1f} µs; {beats:,} heartbeats: {beat_us:.1f} µs each "
        "(wall clock, under the profiler)"
    )


def profile_summary(path: Path, console: Console) -> None:
    for prof in sorted(path.parent.glob(f"{path.stem}-*")):
        stats = pstats.Stats(str(prof))
        console.print(f"[bold]{prof.name}[/]: {per_message(stats)}; top functions by own time")
        stats.sort_stats("tottime").print_stats(15)


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--owners", default="100,1000", help="fleet sizes (default 100,1000)")
    parser.add_argument("--rates", default="500,2000", help="total changes/s (default 500,2000)")
    parser.add_argument("--seconds", type=float, default=20, help="measured per phase")
    parser.add_argument("--warmup", type=float, default=3, help="driven, unmeasured, per phase")
    parser.add_argument(
        "--no-second-replica",
        dest="second_replica",
        action="store_false",
        help="skip the phase with two replicas at the highest rate",
    )
    parser.add_argument(
        "--no-freeze-owners",
        dest="freeze_owners",
        action="store_false",
        help="leave the simulated owners' state to the garbage collector (one shared heap)",
    )
    parser.add_argument(
        "--replica-gc",
        choices=("settle", "default"),
        default="settle",
        help="the replicas' garbage collector: heap.settle's once converged, as a souk part's"
        " once ready (default), or Python's default",
    )
    parser.add_argument("--quick", action="store_true", help="a short run: 5 s phases")
    parser.add_argument(
        "--secure",
        action="store_true",
        help="each fleet plain, signed, and signed over an authenticated TLS bus",
    )
    parser.add_argument(
        "--no-tls", dest="tls", action="store_false", help="with --secure: skip the TLS bus"
    )
    parser.add_argument(
        "--modes",
        help="with --secure: only these of plain,signed,signed+tls (signed checks every batch on"
        " an open bus; signed+tls is the authenticated bus, live batches audited)",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--plot", type=Path, help="write the chart of latency against owners into this directory"
    )
    parser.add_argument(
        "--profile-replica",
        type=Path,
        help="cProfile the first replica (steady state) into FILE-<owners>.prof; slows it",
    )
    parser.add_argument(
        "--keep", type=Path, help="keep the replicas' samples, databases and logs in this dir"
    )
    parser.add_argument(
        "--replay",
        action="store_true",
        help="instead: the replica alone, plain and signed, handed recorded messages in process"
        " (CPU per message that a busy shared host does not blur; --profile-replica profiles"
        " the signed one)",
    )
    parser.add_argument(
        "--replay-changes", type=int, default=10_000, help="with --replay: changes recorded"
    )
    parser.add_argument(
        "--replay-beats",
        type=int,
        default=10,
        help="with --replay: quiet heartbeats recorded per owner",
    )
    args = parser.parse_args()
    args.owners = [int(s) for s in args.owners.split(",")]
    args.rates = [int(s) for s in args.rates.split(",")]
    if args.modes is not None:
        args.modes = set(args.modes.split(","))
        unknown = args.modes - {m.name for m in (PLAIN, SIGNED, SIGNED_TLS)}
        if unknown or not args.secure:
            parser.error(f"--modes takes plain, signed, signed+tls, with --secure ({unknown})")
    if args.quick:
        args.seconds, args.warmup = 5.0, 1.0
    err = Console(stderr=True)
    if args.replay:
        replayed = asyncio.run(measure_replay(args))
        if args.json:
            print(json.dumps([asdict(r) for r in replayed], indent=2))
        else:
            console = Console() if sys.stdout.isatty() else Console(width=170)
            console.print(f"machine: {machine_info()}", replay_table(replayed))
        if args.profile_replica is not None:
            profile_summary(args.profile_replica, err)
        return
    columns = (TextColumn("{task.description}"), BarColumn(), TimeElapsedColumn())
    with Progress(*columns, console=err, transient=args.json) as progress:
        report = asyncio.run(measure(args, progress))
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        console = Console() if sys.stdout.isatty() else Console(width=170)
        console.print(f"machine: {report.machine}; nats-server {report.nats_server}")
        for table in tables(report):
            console.print(table)
    if args.plot is not None:
        err.print(f"chart: {plot(report, args.plot)}")
    if args.profile_replica is not None:
        profile_summary(args.profile_replica, err)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--replica-process":
        url, workers, machines, profile, gc_arg, *security, out = sys.argv[2:]
        settles = gc_arg == "settle"
        replica = replica_process(
            url, int(workers), int(machines), profile == "1", settles, Path(out), security
        )
        asyncio.run(replica)
        raise SystemExit(0)
    if len(sys.argv) > 1 and sys.argv[1] == "--sink-process":
        asyncio.run(sink_process(sys.argv[2], Path(sys.argv[3])))
        raise SystemExit(0)
    main()
