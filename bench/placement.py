"""Placement through the broker as it runs in a cluster, against 10, 100 and 1,000 workers
(`--sizes 10000` too, in about 3 minutes more).

A real `nats-server` on loopback carries the catalog and the offers. Workers are the real worker
code with the `sim` driver (it runs nothing), many per child process; each child opens one NATS
connection that its workers share, and every worker publishes its catalog rows (`publishing`) and
answers the region's offer calls (`offering`), as `souk worker --nats` does. The broker runs in
this process, assembled as `souk broker --nats` assembles it: a catalog replica on its own NATS
connection, `CatalogFleet`, and a `Placer` that gathers offers with one scatter-gather message
on the bus. The load comes from another child process, so the broker's event loop is its own.

For each fleet size, once the broker's replica knows every worker, in one run:
- raw reservations sent straight to one worker (no broker), one at a time and CONCURRENCY in
  flight: the baseline;
- for each strategy (offers, p2c, catalog) the same through the broker: create latency one at a
  time, then placements/s and latency with CONCURRENCY in flight, with the broker's decision time
  (from the start of `Placer.place` to the reservation request: offers gathered and ranked)
  measured inside the broker both ways.
Before the phases of each size and mode, the broker is left alone for `--idle-seconds` (no
creates): its idle CPU, in % of one core and per 1,000 workers (its replica's heartbeats, its
liveness checks). Each loaded phase then gives the marginal CPU of a placement: the broker's CPU
over the phase, less its idle CPU over the same seconds, divided by the placements.
`--http` runs the older mode instead: a `StaticFleet` read once over HTTP, offers as one HTTP
request per worker, no NATS. `--secure [ROUNDS]` measures each size plain and secured as a cluster
across hosts runs (a bench CA certifies every node): every worker signs its rows with its own key
and the broker's replica checks every batch and heartbeat; NATS is a second nats-server
configured as `souk nats config` writes it (mutual TLS, users from certificates, subject
permissions); the broker reserves on workers over mutual TLS, checking each worker's name; the
load reaches the broker's public API over HTTPS. ROUNDS pairs of plain and secured (which goes
first alternating), and a table of the ratios: placements/s (plain over secured), decision p99
and CPU per create (secured over plain).
`--metrics-cost [ROUNDS]` measures each size the same way plain (metrics on, as they run) and with
metrics off in the broker and its workers (`souk broker --no-metrics`, `souk worker
--no-metrics`), ROUNDS pairs of them (which goes first alternating), and adds the same table of
ratios, on over off, one line per pair. `--gc-cost [ROUNDS]`: likewise, the broker's process and
the worker hosts with Python's default garbage collector against souk's (`heap.settle`, which
every part calls once it is ready, and the benchmark's processes once their parts are), with the
broker's time spent collecting per create in each. `--reserve-over-bus [ROUNDS]`: likewise, the
broker reserving over HTTP (plain) and on the bus (`souk broker --reserve-over-bus`: each lane's
request to the worker's own subject), ROUNDS pairs, with the bus's ratios over HTTP.

    .venv/bin/python bench/placement.py            # about 4 minutes; --quick, --json
    .venv/bin/python bench/placement.py --sizes 1000 --profile prof/   # cProfile of the broker
    .venv/bin/python bench/placement.py --sizes 1000 --cpu-sample prof/   # its CPU, sampled
    PYTHONPATH=CHECKOUT/src .venv/bin/python bench/placement.py --parts   # its own parts, alone
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import copy
import cProfile
import functools
import gc
import json
import os
import random
import ssl
import subprocess
import sys
import tempfile
import time
import types
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any, Protocol

import aiohttp
from aiohttp import web
from rich.console import Console
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    TaskID,
    TextColumn,
    TimeElapsedColumn,
)
from rich.table import Table

from _harness import CpuSampler, GcPauses, Pki, open_files, pct, proc_ticks

from souk import heap
from souk.broker.fleet import CatalogFleet, Fleet, StaticFleet
from souk.broker.metrics import BrokerMetrics
from souk.broker.placement.pipeline import Placer
from souk.broker.placement.reservation import placing_client
from souk.broker.placement.stages import rank
from souk.broker.registry import AppRegistry
from souk.broker.runtime import registry_owner, run
from souk.broker.server import make_app
from souk.broker.state import Broker
from souk.broker.tokens import mint
from souk.catalog import http as catalog_http
from souk.catalog.bus import NatsBus
from souk.catalog.certs import bus_options, load_signer
from souk.catalog.metrics import watch_replica
from souk.catalog.permissions import Node, inbox_prefix, permissions
from souk.catalog.protocol import (
    HELLO,
    REGISTRY_OWNER,
    WILDCARD,
    cert_subject,
    changes_subject,
    heartbeat_subject,
    pull_subject,
    reserve_subject,
)
from souk.catalog.replica import following
from souk.catalog.trust import CaTrust
from souk.clients.workers import WorkerClient
from souk.models.api import ConfirmationResult, Strategy
from souk.models.capacity import offers_subject
from souk.models.catalog import WorkerRow
from souk.models.machine import GuestConfig, Machine
from souk.pki import NodeFiles, load_cas
from souk.pki.identity import identity_uri
from souk.pki.tls import server_context
from souk.web.metrics import OFF, Observer
from tests.support.nats import NatsServer, nats_version
from tests.support.ports import free_port

SECRET = b"bench-secret-0123456789abcdef"
REGION = "bench"
APP = "bench"
CONFIG = {"init": {"exec": ["true"]}, "guest": {"cpus": 1, "memory_mb": 256}}
HOSTS = 2  # child processes hosting workers
FILES_PER_WORKER = 8  # its database, journal and shared memory, its socket, connections to it
SPARE_FILES = 1024  # a process's own: NATS, the load, libraries
RESULT_LINE = 1 << 24  # the load's result line, every latency in it: asyncio's 64 KiB is short
STRATEGIES: tuple[Strategy, ...] = ("offers", "p2c", "catalog")
GOAL_RATE = 3750.0  # placements/s: Nomad's million-container run on 5 servers
GOAL_DECISION_P99_MS = 2.0  # at 10,000 workers in a region
GOAL_MARGINAL_MS = 0.3  # the broker's CPU a placement adds, at 1,000 and 10,000 workers
GOAL_IDLE_PER_1000 = 3.0  # the broker's CPU with no creates, % of one core per 1,000 workers
# Modes measured next to "plain" (the broker as it runs) when asked, each set against it in a
# table of ratios: its title, and whether the mode is the costlier of the pair.
SECURE, METRICS_OFF, DEFAULT_GC = "secure", "metrics off", "default gc"
BUS_RESERVE = "bus reserve"  # the broker reserves on the bus (`--reserve-over-bus`), not HTTP
BROKER = "bench-broker"  # the broker's certificate name
COSTS = {
    SECURE: ("what security costs: secured over plain, in the same run (goal ≤ 1.2x)", True),
    METRICS_OFF: ("what metrics cost: on (plain) over off, in the same run (goal ≤ 1.05x)", False),
    DEFAULT_GC: ("Python's default collector over heap.settle's, in the same run", True),
    BUS_RESERVE: ("reservations on the bus over HTTP (plain), in the same run", True),
}


# --- CPU accounting: ours against the host's -----------------------------------------------------


def host_ticks() -> tuple[int, int, int]:
    """(busy, steal, total) clock ticks of the whole host since boot."""
    with open("/proc/stat") as f:
        vals = [int(v) for v in f.readline().split()[1:]]
    idle = vals[3] + vals[4]
    steal = vals[7] if len(vals) > 7 else 0
    total = sum(vals[:8])
    return total - idle - steal, steal, total


@dataclass
class CpuWindow:
    """CPU over one phase: seconds used by each group of this benchmark's processes (broker,
    workers, nats-server, load), and in % of one core everything else on the host and what the
    hypervisor took (steal)."""

    groups: dict[str, list[int]]
    start: tuple[tuple[int, int, int], dict[str, int]] = ((0, 0, 0), {})
    began: float = 0.0

    def __post_init__(self) -> None:
        self.start = (host_ticks(), self._ticks())
        self.began = time.monotonic()

    def _ticks(self) -> dict[str, int]:
        return {name: proc_ticks(pids) for name, pids in self.groups.items()}

    def read(self) -> dict[str, float]:
        (busy0, steal0, total0), ours0 = self.start
        busy1, steal1, total1 = host_ticks()
        ours1 = self._ticks()
        hz = os.sysconf("SC_CLK_TCK")
        span = max(1, total1 - total0) / (os.cpu_count() or 1)  # ticks of one core
        used = {name: (ours1[name] - ours0[name]) / hz for name in self.groups}
        ours = sum(used.values()) * hz / span * 100
        return {
            **{f"{name}_s": round(v, 2) for name, v in used.items()},
            "wall_s": round(time.monotonic() - self.began, 3),
            "ours_pct": round(ours, 1),
            "others_pct": round(max(0.0, (busy1 - busy0) / span * 100 - ours), 1),
            "steal_pct": round((steal1 - steal0) / span * 100, 1),
        }


GC_PAUSES = GcPauses()  # this process's, so the broker's
PYTHON_GC = (700, 10, 10)  # the interpreter's own thresholds


# --- workers: child processes --------------------------------------------------------------------


def fleet_user() -> dict[str, Any]:
    """The secured bus's user for a host of workers: they share one connection here, so it may
    publish and answer for every worker of the region (a real worker only for itself)."""
    perms = permissions(Node("worker", "fleet", REGION))
    perms["publish"]["allow"] = [changes_subject(REGION), heartbeat_subject(REGION)]
    perms["subscribe"]["allow"] = [
        pull_subject(WILDCARD), cert_subject(WILDCARD), HELLO, offers_subject(REGION),
        reserve_subject(WILDCARD), f"{inbox_prefix('worker', 'fleet')}.>",
    ]  # fmt: skip
    return {"user": identity_uri("worker", "fleet"), "permissions": perms}


def secure_cluster(workdir: Path, size: int) -> Pki:
    """A bench CA and every node's files: `size` workers (named as their ids, reached on
    loopback), the workers' shared bus user, the broker."""
    pki = Pki(workdir)
    for i in range(size):
        pki.files("worker", f"w{i}", sans=["127.0.0.1"])
    pki.files("worker", "fleet")
    pki.files("broker", BROKER, sans=["127.0.0.1"])
    return pki


async def serve_workers(
    count: int,
    offset: int,
    data_dir: Path,
    nats: str | None,
    tls_dir: Path | None = None,
    metrics: bool = True,
    souk_gc: bool = True,
) -> None:
    """Child process: `count` sim workers on loopback sharing one NATS connection (if any);
    prints one URL per line, then `ready`, then waits for stdin to close. With `tls_dir` (the
    nodes' files, `secure_cluster`), secured as `souk worker --tls-dir` is: mutual TLS, every
    route checked against the caller's role, rows signed with the worker's own key. `souk_gc`:
    `heap.settle` once ready, as `souk worker` does; else Python's default collector."""
    from souk.worker.daemon import make_app as worker_app
    from souk.worker.daemon import make_driver, offering, publishing, running, tls_context
    from souk.worker.engine import Engine
    from souk.worker.http.state import FENCES
    from souk.worker.reserving import reserving
    from souk.worker.settings import WorkerSettings

    open_files(files_for(count))
    async with contextlib.AsyncExitStack() as stack:
        bus = None
        if nats:
            fleet = None if tls_dir is None else NodeFiles.in_dir(tls_dir / "fleet", "fleet")
            options = {} if fleet is None else bus_options(fleet)
            bus = await NatsBus.connect(nats, name=f"bench-workers-{offset}", **options)
            stack.push_async_callback(bus.close)
        for i in range(offset, offset + count):
            s = WorkerSettings(
                name=f"w{i}",
                region=REGION,
                data_dir=data_dir / f"w{i}",
                cpus=100_000,
                memory_mb=100_000_000,
                durable=False,
                metrics=metrics,
            )
            engine = await stack.enter_async_context(running(Engine(s, make_driver("sim", s))))
            files = None if tls_dir is None else NodeFiles.in_dir(tls_dir / s.name, s.name)
            runner = web.AppRunner(worker_app(engine, secure=files is not None), access_log=None)
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            ctx = None if files is None else tls_context(files)
            await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024, ssl_context=ctx).start()
            scheme = "http" if files is None else "https"
            url = f"{scheme}://127.0.0.1:{runner.addresses[0][1]}"
            if bus is not None:
                signer = None if files is None else load_signer(files, s.name)
                await stack.enter_async_context(publishing(engine, bus, url, signer))
                await stack.enter_async_context(offering(engine, bus))
                fences = runner.app[FENCES]
                await stack.enter_async_context(reserving(engine, fences, bus, files is not None))
            print(url, flush=True)
        if souk_gc:
            heap.settle()
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


def files_for(workers: int) -> int:
    """Files a process hosting, or connected to, this many workers may hold at once."""
    return FILES_PER_WORKER * workers + SPARE_FILES


@dataclass
class Hosts:
    urls: list[str]
    pids: list[int]


@contextlib.asynccontextmanager
async def worker_hosts(
    total: int,
    data_dir: Path,
    nats: str | None,
    progress: Progress,
    task: TaskID,
    profile: Path | None = None,
    tls_dir: Path | None = None,
    metrics: bool = True,
    souk_gc: bool = True,
) -> AsyncIterator[Hosts]:
    procs: list[asyncio.subprocess.Process] = []
    fit = max(1, (open_files(files_for(total)) - SPARE_FILES) // FILES_PER_WORKER)
    host_count = max(HOSTS, -(-total // fit))  # more hosts where one may not open enough files
    per = -(-total // host_count)
    for h in range(host_count):
        count = min(per, total - h * per)
        if count > 0:
            argv = [__file__, "--serve", str(count), str(h * per), str(data_dir), nats or ""]
            argv += [str(tls_dir or ""), "on" if metrics else "off"]
            argv.append("settle" if souk_gc else "default")
            if profile is not None:
                argv.append(str(profile / f"workers-{total}-host{h}.prof"))
            procs.append(
                await asyncio.create_subprocess_exec(
                    sys.executable, *argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE
                )
            )
    hosts = Hosts([], [p.pid for p in procs])
    try:

        async def read(p: asyncio.subprocess.Process) -> None:
            assert p.stdout is not None
            while line := (await p.stdout.readline()).decode().strip():
                if line == "ready":
                    return
                hosts.urls.append(line)
                progress.advance(task)
            raise SystemExit("a worker host exited before it was ready")

        await asyncio.gather(*(read(p) for p in procs))
        yield hosts
    finally:
        for p in procs:  # stdin closed: a host stops its workers and exits
            if p.stdin is not None:
                p.stdin.close()
        for p in procs:
            try:
                await asyncio.wait_for(p.wait(), 60)
            except TimeoutError:
                p.kill()
                await p.wait()


# --- the broker, in this process -----------------------------------------------------------------


class Decisions:
    """Each decision's wall-clock time, and for the catalog strategy (which does not wait between
    its start and its ranking) the broker thread's CPU time in it, of which the collector's: on
    two shared cores a decision's wall-clock tail is mostly the time the kernel gave the thread
    to others, which the CPU time leaves out."""

    def __init__(self, placer: Placer) -> None:
        self.wall: list[float] = []
        self.cpu: list[float] = []
        self.collecting: list[float] = []
        self._began = (0.0, 0.0)
        place = placer.place

        async def placing(*args: Any, **kwargs: Any) -> Machine:
            # Read before `place` starts its wall clock: on a busy host this read (a system
            # call) often hands the core to another process for a while, 0.27 ms on average
            # and 4.5 ms at p99 in a loaded phase here, which inside the window the wall-clock
            # figure took for the decision's own. Off the core is no CPU time of the thread.
            self._began = (time.thread_time(), GC_PAUSES.total)
            return await place(*args, **kwargs)

        placer.place = placing  # type: ignore[method-assign]
        placer.on_decision = self.decided

    def decided(self, strategy: str, seconds: float) -> None:
        self.wall.append(seconds)
        if strategy == "catalog":
            cpu, collecting = self._began
            self.cpu.append(time.thread_time() - cpu)
            self.collecting.append(GC_PAUSES.total - collecting)

    def taken(self) -> Decisions:
        """What was recorded so far, and a fresh record from now."""
        taken = copy.copy(self)
        self.wall, self.cpu, self.collecting = [], [], []
        return taken


@dataclass
class BrokerUnderTest:
    url: str
    placer: Placer
    fleet: Fleet
    decisions: Decisions
    batches: Callable[[], int] = lambda: 0  # catalog batches its replica has taken so far
    requests: Callable[[], int] = lambda: 0  # reservation requests it has sent to workers
    confirmations: Callable[[], int] = lambda: 0  # confirmation requests of their own, sent

    def known(self) -> int:
        return len(self.fleet.workers(region=REGION))


@dataclass
class Counting:
    """Counts what a metric observes (whether metrics are on or off), and passes it on."""

    inner: Observer
    count: int = 0

    def observe(self, amount: float) -> None:
        self.count += 1
        self.inner.observe(amount)


@contextlib.asynccontextmanager
async def serve_broker(
    broker: Broker,
    placer: Placer,
    extra: list[Any] | None = None,
    tls: NodeFiles | None = None,
) -> AsyncIterator[BrokerUnderTest]:
    """The public API; with `tls`, over HTTPS (`souk broker --tls-cert/--tls-key`)."""
    runner = web.AppRunner(make_app(broker, SECRET, extra or []), access_log=None)
    await runner.setup()
    ctx = None if tls is None else server_context(tls, require_client_cert=False)
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024, ssl_context=ctx).start()
    scheme = "http" if tls is None else "https"
    url = f"{scheme}://127.0.0.1:{runner.addresses[0][1]}"
    b = BrokerUnderTest(url, placer, broker.fleet, Decisions(placer))
    sent = placer.reserver.sent = Counting(placer.reserver.sent)
    b.requests = lambda: sent.count
    client, confirms = placer.reserver.client, Counting(OFF)
    confirm = client.confirm

    async def counted(*args: Any, **kwargs: Any) -> ConfirmationResult:
        confirms.observe(1)
        return await confirm(*args, **kwargs)

    client.confirm = counted  # type: ignore[method-assign]
    b.confirmations = lambda: confirms.count
    try:
        yield b
    finally:
        await runner.cleanup()


@contextlib.asynccontextmanager
async def catalog_broker(
    nats: str,
    data_dir: Path,
    tls: NodeFiles | None = None,
    metrics: bool = True,
    reserve_over_bus: bool = False,
) -> AsyncIterator[BrokerUnderTest]:
    """The broker as `broker_site` assembles it with `--nats` and a registry: a replica on its
    own connection (bootstrapping, its SQLite copy in a file), `CatalogFleet`, the registry as
    owner of the apps rows, and a `Placer` that asks for offers on the bus. With `tls` (its
    node files), secured as `souk broker --tls-dir` is: its replica checks every owner's
    signature, the registry signs, the bus and the workers are reached over mutual TLS, and the
    public API is HTTPS. `metrics`: as `--metrics/--no-metrics`; `reserve_over_bus`: as
    `--reserve-over-bus`."""
    async with contextlib.AsyncExitStack() as stack:
        options = {} if tls is None else bus_options(tls)
        bus = await NatsBus.connect(nats, name="souk-broker", **options)
        stack.push_async_callback(bus.close)
        data_dir.mkdir(parents=True, exist_ok=True)
        trust = None if tls is None else CaTrust(load_cas(tls.ca))
        replica = await stack.enter_async_context(
            following(bus, data_dir / "catalog.db", trust=trust)
        )
        watched = BrokerMetrics(metrics)
        watch_replica(watched.metrics, replica)
        registry = AppRegistry(data_dir / "apps.db")
        stack.callback(registry.close)
        signer = None if tls is None else load_signer(tls, REGISTRY_OWNER)
        await stack.enter_async_context(registry_owner(bus, registry, signer))
        registry.create(APP)
        fleet = CatalogFleet(replica, registry)
        client = WorkerClient(tls=tls)
        placer = Placer(
            fleet,
            placing_client(tls),
            bus=bus,
            metrics=watched,
            reserve_over_bus=reserve_over_bus,
        )
        broker = Broker(fleet, client, placer, registry)
        b = await stack.enter_async_context(
            serve_broker(broker, placer, catalog_http.routes(replica), tls)
        )
        b.batches = lambda: replica.stats["batches"]
        yield b


@contextlib.asynccontextmanager
async def http_broker(urls: list[str], metrics: bool = True) -> AsyncIterator[BrokerUnderTest]:
    """The older mode: a `StaticFleet` read once, offers as one HTTP request per worker."""
    client = WorkerClient()
    registry = AppRegistry()
    registry.create(APP)
    fleet = StaticFleet(urls, registry, client)
    await fleet.refresh(machines=False)
    placer = Placer(fleet, placing_client(), metrics=BrokerMetrics(metrics))
    async with serve_broker(Broker(fleet, client, placer, registry=registry), placer) as b:
        yield b


async def warm_pool(b: BrokerUnderTest) -> None:
    """Opens the broker's connection to every worker (secured, with its handshake), as a broker
    that places continuously holds them (an idle one is kept a minute: `TLS_KEEPALIVE`): at
    1,000 workers the unmeasured creates before a phase reach only some of them."""
    limit = asyncio.Semaphore(64)

    async def touch(worker: WorkerRow) -> None:
        async with limit:
            await b.placer.client.capacity(worker.id, worker.address)

    await asyncio.gather(*(touch(w) for w in b.fleet.workers(region=REGION)))


# --- load: a child process -----------------------------------------------------------------------


async def load(spec: dict[str, Any]) -> None:
    """Child process: `warmup` POSTs at `concurrency` in flight, unmeasured; says `warm` and
    waits for a line on stdin; then `requests` POSTs at `concurrency` in flight; prints `n DONE`
    as it goes and `result {json}` at the end."""
    requests, concurrency = int(spec["requests"]), int(spec["concurrency"])
    latencies: list[float] = []
    statuses: dict[str, int] = {}
    todo = iter(range(requests))
    every = max(1, requests // 40)
    ssl_ctx: ssl.SSLContext | bool = True
    if spec.get("tls"):  # the broker's CA; and a broker's certificate, for the raw phase
        ca, cert, key = spec["tls"]
        ssl_ctx = ssl.create_default_context(cafile=ca)
        ssl_ctx.load_cert_chain(cert, key)
    connector = aiohttp.TCPConnector(limit=concurrency, ssl=ssl_ctx)
    async with aiohttp.ClientSession(connector=connector, headers=spec["headers"]) as session:

        async def post() -> None:
            async with session.post(spec["url"], json=spec["body"]) as resp:
                await resp.read()

        # Unmeasured creates first, at the same concurrency: the connections they open (and,
        # secured, their handshakes) are kept, by this client and by the broker towards its
        # workers, as in a cluster that has been placing for a while.
        warmup = iter(range(int(spec["warmup"])))

        async def warm() -> None:
            for _ in warmup:
                await post()

        await asyncio.gather(*(warm() for _ in range(concurrency)))
        print("warm", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)

        async def one() -> None:
            for _ in todo:
                t = time.perf_counter()
                async with session.post(spec["url"], json=spec["body"]) as resp:
                    await resp.read()
                    statuses[str(resp.status)] = statuses.get(str(resp.status), 0) + 1
                latencies.append(time.perf_counter() - t)
                if len(latencies) % every == 0:
                    print(f"n {len(latencies)}", flush=True)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    result = {"elapsed": elapsed, "latencies": latencies, "statuses": statuses}
    print("result " + json.dumps(result), flush=True)


@dataclass
class LoadResult:
    rate: float
    latencies: list[float]
    failed: int
    cpu: dict[str, float]
    batches: int = 0  # catalog batches the broker's replica took meanwhile
    requests: int = 0  # reservation requests the broker sent meanwhile
    confirmations: int = 0  # confirmation requests of their own the broker sent meanwhile


async def run_load(
    url: str,
    requests: int,
    concurrency: int,
    body: dict[str, Any],
    headers: dict[str, str],
    groups: dict[str, list[int]],
    progress: Progress,
    task: TaskID,
    tls: NodeFiles | None = None,
    profilers: Sequence[Profiling] = (),
    counters: Callable[[], tuple[int, int, int]] = lambda: (0, 0, 0),
) -> LoadResult:
    """`counters`: the broker's catalog batches, reservation requests and confirmation requests
    so far, read as the measured requests begin and end (the warm-up's are not theirs)."""
    spec = {
        "url": url,
        "warmup": max(2 * concurrency, requests // 4),
        "requests": requests,
        "concurrency": concurrency,
        "body": body,
        "headers": headers,
        "tls": None if tls is None else [str(tls.ca), str(tls.cert), str(tls.key)],
    }
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        __file__,
        "--load",
        json.dumps(spec),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        limit=RESULT_LINE,
    )
    assert proc.stdout is not None and proc.stdin is not None
    while (line := (await proc.stdout.readline()).decode()) and line.strip() != "warm":
        pass
    cpu = CpuWindow({**groups, "load": [proc.pid]})
    collecting = GC_PAUSES.total
    before = counters()
    for profiler in profilers:
        profiler.enable()
    proc.stdin.write(b"go\n")
    await proc.stdin.drain()
    result: dict[str, Any] | None = None
    usage: dict[str, float] = {}
    while line := (await proc.stdout.readline()).decode():
        if line.startswith("n "):
            progress.update(task, completed=int(line.split()[1]))
        elif line.startswith("result "):
            usage = cpu.read()  # before the load process exits and its counters go
            usage["broker_gc_s"] = GC_PAUSES.total - collecting
            counted = [now - then for now, then in zip(counters(), before, strict=True)]
            for profiler in profilers:
                profiler.disable()
            result = json.loads(line.removeprefix("result "))
    await proc.wait()
    if result is None:
        raise SystemExit("the load process failed")
    progress.update(task, completed=requests)
    ok = result["statuses"].get("200", 0) + result["statuses"].get("201", 0)
    rate = requests / result["elapsed"]
    return LoadResult(rate, result["latencies"], requests - ok, usage, *counted)


class RedrawnWhenTold(Progress):
    """A progress bar redrawn when it is told something (at most five times a second), never on
    a timer: rich's timer is a thread in this process, the broker's, that redraws ten times a
    second, 0.3% of a core that the broker's idle and loaded CPU counted as the broker's."""

    drawn = 0.0

    def update(self, task_id: TaskID, **fields: Any) -> None:
        super().update(task_id, **fields)
        self._redraw()

    def advance(self, task_id: TaskID, advance: float = 1) -> None:
        super().advance(task_id, advance)
        self._redraw()

    def _redraw(self) -> None:
        if time.monotonic() - self.drawn >= 0.2:
            self.drawn = time.monotonic()
            self.refresh()


# --- between and around phases ------------------------------------------------------------------


async def cpu_pct(pids: list[int], seconds: float) -> float:
    """CPU of these processes over the next `seconds`, in % of one core."""
    window = CpuWindow({"p": pids})
    await asyncio.sleep(seconds)
    return window.read()["p_s"] / seconds * 100


async def settle(pids: list[int], idle: float, timeout: float = 120) -> None:
    """Wait until the worker hosts are back to idle: after a phase whose creates have all
    returned, they may still be answering its offer calls, which would bill the next phase."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline and await cpu_pct(pids, 0.5) > max(2 * idle, idle + 15):
        pass


class Profiling(Protocol):
    """A profile of the broker that `run_load` turns on over what it measures only (not the
    unmeasured creates before it)."""

    def enable(self) -> None: ...

    def disable(self) -> None: ...


@contextlib.contextmanager
def profiled(into: Path | None, sampled: Path | None, name: str) -> Iterator[list[Profiling]]:
    """This process's (the broker's) profiles for the block: a cProfile written to
    `into/name.prof`, CPU-time samples to `sampled/name.stacks` (`CpuSampler`)."""
    profile, sampler = cProfile.Profile(), CpuSampler()
    chosen: list[Profiling] = []
    if into is not None:
        chosen.append(profile)
    if sampled is not None:
        chosen.append(sampler)
    try:
        yield chosen
    finally:
        for profiler in chosen:
            profiler.disable()
        if into is not None:
            profile.dump_stats(into / f"{name}.prof")
        if sampled is not None:
            sampler.write(sampled / f"{name}.stacks")


def decision_parts(size: int, placer: Placer, rounds: int = 50) -> dict[str, float]:
    """The catalog strategy's decision taken apart, at rest, p50 ms of `rounds`: reading the
    region's rows from the fleet, filtering one slice of them into candidates, ranking them."""
    guest = GuestConfig.model_validate(CONFIG["guest"])
    read, build, ranking = [], [], []
    for _ in range(rounds):
        t0 = time.perf_counter()
        rows = placer.fleet.placeable(REGION)
        t1 = time.perf_counter()
        _, cands, _ = placer.eligible(rows[: placer.sample], guest)  # one slice
        t2 = time.perf_counter()
        rank(cands, guest)
        t3 = time.perf_counter()
        read.append(t1 - t0)
        build.append(t2 - t1)
        ranking.append(t3 - t2)
    return {
        "workers": size,
        "read_rows_ms": pct(read, 50),
        "candidates_ms": pct(build, 50),
        "rank_ms": pct(ranking, 50),
    }


# --- the run -------------------------------------------------------------------------------------


@dataclass
class Row:
    workers: int
    strategy: str  # raw (straight to one worker) or a placement strategy
    rate: float  # creates/s at `concurrency` in flight
    vs_raw: float
    p50_ms: float
    p99_ms: float
    alone_p50_ms: float  # one create at a time
    alone_p99_ms: float
    decision_alone_p50_ms: float | None  # inside the broker, one create at a time
    decision_alone_p99_ms: float | None
    decision_p50_ms: float | None  # inside the broker, `concurrency` in flight
    decision_p99_ms: float | None
    decision_cpu_p99_ms: float | None  # the broker thread's CPU time in it (catalog strategy)
    decisions_collecting: float | None  # the share of decisions the collector ran in
    failed: int
    cpu: dict[str, float]  # loaded phase: seconds per process group, % of one core for the host
    cpu_ms_per_create: dict[str, float]  # loaded phase: broker, workers, nats
    gc_ms_per_create: float = 0.0  # loaded phase: the broker's process in garbage collection
    batches_per_create: float = 0.0  # loaded phase: catalog batches the broker's replica took
    requests_per_create: float = 0.0  # loaded phase: reservation requests the broker sent
    confirmations_per_create: float = 0.0  # loaded phase: confirmation requests of their own
    mode: str = "plain"  # or SECURE (signed rows, TLS everywhere: the cluster across hosts),
    # METRICS_OFF (the broker and its workers record no metrics), or DEFAULT_GC (the broker and
    # its workers keep Python's default collector instead of `heap.settle`'s)
    round: int = 0  # --secure, --metrics-cost, --gc-cost: which pair of plain and the other
    broker_idle_pct: float = 0.0  # the broker's CPU with no creates, % of one core
    marginal_ms: float = 0.0  # loaded: (its CPU - idle CPU over the same seconds) / placements
    bus_fallbacks: int = 0  # BUS_RESERVE: lane requests sent over HTTP so far, the bus silent

    def marginal(self, loaded: LoadResult, requests: int, idle_pct: float) -> None:
        """What a placement adds to the broker's CPU: its loaded CPU, less what it spends idle
        (heartbeats, liveness) over the same seconds, per placement."""
        self.broker_idle_pct = idle_pct
        idle_s = idle_pct / 100 * loaded.cpu["wall_s"]
        self.marginal_ms = round((loaded.cpu["broker_s"] - idle_s) * 1000 / requests, 3)

    @property
    def idle_per_1000(self) -> float:
        """The broker's idle CPU per 1,000 workers, % of one core."""
        return self.broker_idle_pct * 1000 / self.workers

    @classmethod
    def of(
        cls,
        workers: int,
        strategy: str,
        loaded: LoadResult,
        alone: LoadResult,
        raw_rate: float,
        requests: int,
        alone_decisions: list[float] | None,
        decisions: Decisions | None,
    ) -> Row:
        return cls(
            workers=workers,
            strategy=strategy,
            rate=loaded.rate,
            vs_raw=loaded.rate / raw_rate,
            p50_ms=pct(loaded.latencies, 50),
            p99_ms=pct(loaded.latencies, 99),
            alone_p50_ms=pct(alone.latencies, 50),
            alone_p99_ms=pct(alone.latencies, 99),
            decision_alone_p50_ms=None if alone_decisions is None else pct(alone_decisions, 50),
            decision_alone_p99_ms=None if alone_decisions is None else pct(alone_decisions, 99),
            decision_p50_ms=None if decisions is None else pct(decisions.wall, 50),
            decision_p99_ms=None if decisions is None else pct(decisions.wall, 99),
            decision_cpu_p99_ms=None
            if decisions is None or not decisions.cpu
            else pct(decisions.cpu, 99),
            decisions_collecting=None
            if decisions is None or not decisions.cpu
            else sum(1 for c in decisions.collecting if c > 0) / len(decisions.collecting),
            failed=loaded.failed + alone.failed,
            cpu=loaded.cpu,
            cpu_ms_per_create={
                g: round(loaded.cpu[f"{g}_s"] * 1000 / requests, 3)
                for g in ("broker", "workers", "nats")
            },
            gc_ms_per_create=round(loaded.cpu.get("broker_gc_s", 0.0) * 1000 / requests, 4),
            batches_per_create=round(loaded.batches / requests, 2),
            requests_per_create=round(loaded.requests / requests, 2),
            confirmations_per_create=round(loaded.confirmations / requests, 2),
        )


@dataclass
class Report:
    mode: str
    cpus: int
    python: str
    nats_server: str
    requests: int
    sequential: int
    concurrency: int
    strategies: list[str] = field(default_factory=list)
    rows: list[Row] = field(default_factory=list)
    parts: list[dict[str, float]] = field(default_factory=list)


async def one_size(
    size: int,
    args: argparse.Namespace,
    workdir: Path,
    nats: tuple[str, int] | None,
    progress: Progress,
    report: Report,
    mode: str = "plain",
    round_: int = 0,
) -> None:
    """One size in one mode; secured, on a nats-server of its own configured for the cluster."""
    task = progress.add_task(f"{size:>5} workers ({mode}): starting", total=size)
    data = workdir / f"size-{size}-{mode.replace(' ', '-')}-{round_}"
    for into in (args.profile, args.cpu_sample):
        if into:
            into.mkdir(parents=True, exist_ok=True)
    nats_url = nats[0] if nats else None
    tls_dir = broker_tls = None
    nats_pid = nats[1] if nats else None
    async with contextlib.AsyncExitStack() as secured:
        if mode == SECURE and nats is not None:
            progress.update(task, description=f"{size:>5} workers ({mode}): certificates")
            pki = secure_cluster(data, size)
            tls_dir, broker_tls = pki.dir, pki.files("broker", BROKER)
            port = free_port()
            config = pki.bus_config(port, [Node("broker", BROKER)], [fleet_user()])
            log_path = data / "nats-server-tls.log"
            server = secured.enter_context(NatsServer(port, config=config, log_path=log_path))
            nats_url, nats_pid = f"tls://127.0.0.1:{port}", server.pid
        await measure_size(
            size, args, data, nats_url, nats_pid, tls_dir, broker_tls, progress, task, report,
            mode, round_,
        )  # fmt: skip
    progress.update(task, description=f"{size:>5} workers: done")


async def measure_size(
    size: int,
    args: argparse.Namespace,
    data: Path,
    nats_url: str | None,
    nats_pid: int | None,
    tls_dir: Path | None,
    broker_tls: NodeFiles | None,
    progress: Progress,
    task: TaskID,
    report: Report,
    mode: str,
    round_: int,
) -> None:
    metrics = mode != METRICS_OFF
    headers = {"Authorization": f"Bearer {mint(SECRET)}"}
    raw_body = {"app": APP, "config": CONFIG}
    body = {"region": REGION, "config": CONFIG}
    souk_gc = mode != DEFAULT_GC
    open_files(files_for(size))  # the broker holds a connection to each worker
    hosting = worker_hosts(
        size, data, nats_url, progress, task, args.profile, tls_dir, metrics, souk_gc
    )
    async with hosting as hosts:
        groups = {
            "broker": [os.getpid()],
            "workers": hosts.pids,
            "nats": [nats_pid] if nats_pid else [],
        }
        broker_cm = (
            catalog_broker(nats_url, data / "broker", broker_tls, metrics, mode == BUS_RESERVE)
            if nats_url
            else http_broker(hosts.urls, metrics)
        )
        progress.update(task, description=f"{size:>5} workers: broker catching up", completed=0)
        async with broker_cm as b:
            deadline = time.monotonic() + max(120, size / 20)  # a crowded host is slow
            while (known := b.known()) < size:
                if time.monotonic() > deadline:
                    raise SystemExit(f"the broker's catalog knows {known} of {size} workers")
                progress.update(task, completed=known)
                await asyncio.sleep(0.05)

            if souk_gc:  # as every souk part does once it is ready
                heap.settle()
            else:  # from a heap as clean as settle's: an earlier size's cycles, frozen with
                gc.unfreeze()  # it, are not this phase's garbage
                gc.set_threshold(*PYTHON_GC)
                gc.collect()
            idle = await cpu_pct(hosts.pids, 1.0)
            await settle(hosts.pids, idle)
            progress.update(task, description=f"{size:>5} workers: the broker idle")
            with profiled(None, args.cpu_sample, f"broker-{size}-{mode}-idle") as profilers:
                for profiler in profilers:
                    profiler.enable()
                broker_idle = await cpu_pct([os.getpid()], args.idle_seconds)

            async def phase(name: str, url: str, n: int, c: int, body: Any, hdr: Any) -> LoadResult:
                progress.update(task, description=f"{size:>5} workers: settling before {name}")
                await settle(hosts.pids, idle)
                if url.startswith(b.url):
                    await warm_pool(b)
                progress.update(task, description=f"{size:>5} workers: {name}", total=n)
                progress.reset(task, total=n)
                b.decisions.taken()
                named = f"broker-{size}-{mode}-{name}".replace(" ", "_")
                with profiled(args.profile, args.cpu_sample, named) as profilers:
                    return await run_load(
                        url, n, c, body, hdr, groups, progress, task, broker_tls, profilers,
                        lambda: (b.batches(), b.requests(), b.confirmations()),
                    )  # fmt: skip

            raw_url = hosts.urls[0] + "/v1/machines"
            raw_alone = await phase("raw alone", raw_url, args.sequential, 1, raw_body, {})
            raw = await phase("raw loaded", raw_url, args.requests, args.concurrency, raw_body, {})
            report.rows.append(
                Row.of(size, "raw", raw, raw_alone, raw.rate, args.requests, None, None)
            )
            report.rows[-1].mode, report.rows[-1].round = mode, round_
            for strategy in args.strategies:
                url = f"{b.url}/v1/apps/{APP}/machines?strategy={strategy}"
                alone = await phase(f"{strategy} alone", url, args.sequential, 1, body, headers)
                alone_decisions = b.decisions.taken().wall
                loaded = await phase(
                    f"{strategy} loaded", url, args.requests, args.concurrency, body, headers
                )
                report.rows.append(
                    Row.of(
                        size,
                        strategy,
                        loaded,
                        alone,
                        raw.rate,
                        args.requests,
                        alone_decisions,
                        b.decisions.taken(),
                    )
                )
                report.rows[-1].mode, report.rows[-1].round = mode, round_
                report.rows[-1].marginal(loaded, args.requests, broker_idle)
                report.rows[-1].bus_fallbacks = b.placer.reserver.bus_fallbacks
            report.parts.append(decision_parts(size, b.placer))


async def measure(args: argparse.Namespace, progress: Progress) -> Report:
    report = Report(
        mode="http" if args.http else "catalog",
        cpus=os.cpu_count() or 0,
        python=sys.version.split()[0],
        nats_server="" if args.http else nats_version(),
        requests=args.requests,
        sequential=args.sequential,
        concurrency=args.concurrency,
        strategies=list(args.strategies),
    )
    with tempfile.TemporaryDirectory(prefix="souk-bench-") as tmp:
        workdir = Path(tmp)
        async with contextlib.AsyncExitStack() as stack:
            nats = None
            if not args.http:
                server = stack.enter_context(NatsServer(log_path=workdir / "nats-server.log"))
                nats = (server.url, server.pid)
            for size in args.sizes:
                for mode, round_ in schedule(
                    {
                        SECURE: args.secure,
                        METRICS_OFF: args.metrics_cost,
                        DEFAULT_GC: args.gc_cost,
                        BUS_RESERVE: args.reserve_over_bus,
                    }
                ):
                    await one_size(size, args, workdir, nats, progress, report, mode, round_)
                    if args.save is not None:  # as it goes: a later size may not finish
                        args.save.write_text(json.dumps(asdict(report), indent=2))
    return report


def schedule(rounds: dict[str, int]) -> list[tuple[str, int]]:
    """Each size's modes and rounds, in order: round r runs plain and every costlier mode asked
    for that many rounds, and which runs first alternates from round to round (plain first in
    even rounds), so that an effect of the order (a host getting busier, a heap growing) does
    not pass for a cost. Round r's plain is shared by every mode of round r."""
    out: list[tuple[str, int]] = []
    for r in range(max([1, *rounds.values()])):
        group = [("plain", r), *((mode, r) for mode, n in rounds.items() if r < n)]
        out += group[::-1] if r % 2 else group
    return out


def pair(a: float | None, b: float | None) -> str:
    return "-" if a is None or b is None else f"{a:.1f} / {b:.1f}"


def tables(report: Report) -> list[Table]:
    speed = Table(
        title=f"creates through the broker ({report.mode} mode): {report.requests} at "
        f"{report.concurrency} in flight, {report.sequential} one at a time"
    )
    for col in (
        "workers", "strategy", "placements/s", "vs raw", "p50 / p99 ms",
        "one at a time p50 / p99 ms", "failed",
    ):  # fmt: skip
        speed.add_column(col, justify="left" if col == "strategy" else "right")
    inside = Table(title="inside the broker: decision time, and CPU per create (loaded)")
    for col in (
        "workers", "strategy", "decision p50 / p99 ms, one at a time",
        "decision p50 / p99 ms, loaded", "its CPU p99 ms (collected in)",
        "CPU ms/create: broker / workers / nats",
        "per create: catalog batches / reservation requests / confirmations",
        "host: others / steal %",
    ):  # fmt: skip
        inside.add_column(col, justify="left" if col == "strategy" else "right")
    for r in report.rows:
        last = r.strategy == report.strategies[-1]
        name = "raw, one worker" if r.strategy == "raw" else r.strategy
        if r.mode != "plain":
            name += f" ({r.mode})"
        speed.add_row(
            f"{r.workers:,}", name, f"{r.rate:,.0f}", f"{r.vs_raw:.2f}", pair(r.p50_ms, r.p99_ms),
            pair(r.alone_p50_ms, r.alone_p99_ms), str(r.failed), end_section=last,
        )  # fmt: skip
        c = r.cpu_ms_per_create
        inside.add_row(
            f"{r.workers:,}", name, pair(r.decision_alone_p50_ms, r.decision_alone_p99_ms),
            pair(r.decision_p50_ms, r.decision_p99_ms), decision_cpu(r),
            f"{c['broker']:.2f} / {c['workers']:.2f} / {c['nats']:.2f}",
            f"{r.batches_per_create:.2f} / {r.requests_per_create:.2f}"
            f" / {r.confirmations_per_create:.2f}",
            f"{r.cpu['others_pct']:.0f} / {r.cpu['steal_pct']:.0f}", end_section=last,
        )  # fmt: skip
    parts = Table(title="the catalog decision taken apart, at rest (p50 ms)")
    for col in ("workers", "read the region's rows", "filter into candidates", "rank"):
        parts.add_column(col, justify="right")
    for p in report.parts:
        parts.add_row(
            f"{p['workers']:,.0f}", f"{p['read_rows_ms']:.2f}", f"{p['candidates_ms']:.2f}",
            f"{p['rank_ms']:.2f}",
        )  # fmt: skip
    out = [speed, inside, parts, broker_cpu(report)]
    plain = {(r.workers, r.strategy, r.round): r for r in report.rows if r.mode == "plain"}
    for mode, (title, costlier) in COSTS.items():
        twins = [r for r in report.rows if r.mode == mode and key(r) in plain]
        if twins:
            pairs = [(plain[key(r)], r) for r in twins]
            out.append(cost_table(title, [(b, a) if costlier else (a, b) for a, b in pairs]))
    return out


def broker_cpu(report: Report) -> Table:
    """The broker's CPU apart: what it spends with no creates (its replica's heartbeats, its
    liveness checks), and what each placement adds to it."""
    t = Table(
        title="the broker's CPU: idle (no creates) and marginal per placement (loaded CPU less"
        f" idle CPU over the same seconds); goals: idle ≤ {GOAL_IDLE_PER_1000:g}% of a core per"
        f" 1,000 workers, marginal ≤ {GOAL_MARGINAL_MS:g} ms"
    )
    for col in (
        "workers", "strategy", "idle, % of a core", "idle per 1,000 workers", "loaded ms/create",
        "marginal ms/placement",
    ):  # fmt: skip
        t.add_column(col, justify="left" if col == "strategy" else "right")
    for r in report.rows:
        if r.strategy == "raw":
            continue
        name = r.strategy if r.mode == "plain" else f"{r.strategy} ({r.mode})"
        t.add_row(
            f"{r.workers:,}", name, f"{r.broker_idle_pct:.1f}", f"{r.idle_per_1000:.2f}%",
            f"{r.cpu_ms_per_create['broker']:.3f}", f"{r.marginal_ms:.3f}",
        )  # fmt: skip
    return t


def decision_cpu(r: Row) -> str:
    if r.decision_cpu_p99_ms is None or r.decisions_collecting is None:
        return ""
    return f"{r.decision_cpu_p99_ms:.2f} ({r.decisions_collecting:.0%})"


def key(row: Row) -> tuple[int, str, int]:
    return row.workers, row.strategy, row.round


def cost_table(title: str, pairs: list[tuple[Row, Row]]) -> Table:
    """Ratios of each (costlier, cheaper) pair of rows: how much slower, and how much more the
    decision and each create's CPU take; and the broker's time in the collector per create."""
    cost = Table(title=title)
    for col in (
        "workers", "strategy", "round", "placements/s", "decision p99 (loaded)",
        "broker CPU/create", "marginal", "idle", "broker GC ms/create, costlier / cheaper",
        "workers CPU/create",
    ):  # fmt: skip
        cost.add_column(col, justify="left" if col == "strategy" else "right")

    def ratio(a: float | None, b: float | None) -> str:
        return "-" if not a or not b else f"{a / b:.2f}x"

    for costly, cheap in pairs:
        cpu, base = costly.cpu_ms_per_create, cheap.cpu_ms_per_create
        cost.add_row(
            f"{costly.workers:,}", costly.strategy, str(costly.round),
            ratio(cheap.rate, costly.rate),
            ratio(costly.decision_p99_ms, cheap.decision_p99_ms),
            ratio(cpu["broker"], base["broker"]),
            ratio(costly.marginal_ms, cheap.marginal_ms),
            ratio(costly.broker_idle_pct, cheap.broker_idle_pct),
            f"{costly.gc_ms_per_create:.3f} / {cheap.gc_ms_per_create:.3f}",
            ratio(cpu["workers"], base["workers"]),
        )  # fmt: skip
    return cost


# --- a create's broker-side parts, in this process -----------------------------------------------

FLY_CONFIG = {  # a config as Fly's clients send one: an image, a service with its ports and check
    "image": "registry.example/app:1",
    "env": {"A": "1", "B": "2"},
    "guest": {"cpu_kind": "shared", "cpus": 1, "memory_mb": 256},
    "services": [
        {
            "protocol": "tcp",
            "internal_port": 8080,
            "autostop": "stop",
            "ports": [
                {"port": 80, "handlers": ["http"], "force_https": True},
                {"port": 443, "handlers": ["tls", "http"]},
            ],
            "concurrency": {"type": "connections", "soft_limit": 20, "hard_limit": 25},
            "checks": [{"type": "http", "port": 8080, "path": "/health", "interval": "15s"}],
        }
    ],
    "restart": {"policy": "on-failure"},
    "metadata": {"fly_process_group": "app", "fly_release_version": "3"},
}


def cpu_us(call: Callable[[], object], n: int) -> float:
    """CPU µs per call, the best of five rounds of `n` (a busy host only ever adds)."""
    rounds = []
    for _ in range(5):
        t = time.process_time()
        for _ in range(n):
            call()
        rounds.append((time.process_time() - t) / n * 1e6)
    return round(min(rounds), 1)


def done(coro: Any) -> Any:
    """The value of a coroutine that never waits."""
    try:
        coro.send(None)
    except StopIteration as stop:
        return stop.value
    raise RuntimeError("it waited")


def create_parts(workers: int = 1000, full: float = 0.6) -> dict[str, float]:
    """The broker's own parts of a create, each alone, in CPU µs: the feasible stage on one
    slice of 64 rows (`full` of them without room), `Placer.place` in a region of `workers`
    with the reservation answered at once (the decision, its refusals, the journal, the
    metrics), a create's body read (the benchmark's and a Fly client's), and the secrets of an
    app with ten of them opened for a create. Run against two checkouts (`PYTHONPATH=.../src`)
    to compare code: the figures need no cluster and move little with the host's load."""
    from souk.broker.api.machines import read_fly_request
    from souk.broker.api.secrets import machine_secrets
    from souk.broker.placement.candidates import CandidateCache
    from souk.broker.placement.stages import feasible
    from souk.broker.secrets import seal_secret
    from souk.broker.state import BROKER, SEALER
    from souk.models.api import CreateMachineRequest
    from souk.models.catalog import AppRow, WorkerRow
    from souk.models.machine import CreateMachine, GuestConfig
    from souk.sealing import Sealer
    from souk.web.body import BODY_KEY

    rng = random.Random(3)

    def worker_row(i: int) -> WorkerRow:
        reserved = 8 if rng.random() < full else 2
        return WorkerRow.model_validate(
            {
                "id": f"w{i}", "region": REGION, "address": f"http://w{i}",
                "cpu_kinds": ["shared"], "cpus_total": 8, "memory_mb_total": 4096,
                "cpus_reserved": reserved, "memory_mb_reserved": 1024, "epoch": "e",
            }
        )  # fmt: skip

    rows = [worker_row(i) for i in range(workers)]
    guest, cache = GuestConfig.model_validate(CONFIG["guest"]), CandidateCache()
    first = rows[:64]
    out = {"feasible_slice_us": cpu_us(lambda: feasible(first, guest, frozenset(), cache), 5000)}

    fleet = StaticFleet([], AppRegistry())
    fleet.placeable = lambda region: rows  # type: ignore[method-assign]  # held, as a replica's
    fleet.silent = lambda region: []  # type: ignore[method-assign]
    placer = Placer(fleet, WorkerClient(), rng=random.Random(1))
    create = CreateMachine.model_validate({"app": APP, "config": CONFIG})
    machine = Machine.model_validate(
        {
            "id": "m1", "name": "m1", "app": APP, "region": REGION, "state": "created",
            "instance_id": "i", "config": CONFIG, "worker": "w1", "created_at": "t",
            "updated_at": "t",
        }
    )  # fmt: skip

    async def reserved(*_: Any, **__: Any) -> Machine:
        return machine

    placer.reserver.reserve = reserved  # type: ignore[method-assign]
    out["place_us"] = cpu_us(lambda: done(placer.place(REGION, create, "catalog")), 2000)

    for name, config in (("bench", CONFIG), ("fly", FLY_CONFIG)):
        body = {"region": REGION, "config": config}
        request: dict[Any, Any] = {BODY_KEY: body}  # all a body's reading asks of a request

        def read(request: dict[Any, Any] = request, body: Any = body) -> object:
            request[BODY_KEY] = body
            return done(read_fly_request(request, CreateMachineRequest))  # type: ignore[arg-type]

        out[f"read_body_{name}_us"] = cpu_us(read, 3000)

    sealer = Sealer(SECRET)
    app = AppRow(
        name=APP,
        created_at="t",
        secrets={f"S{i}": seal_secret(sealer, APP, f"S{i}", "v" * 40, "t") for i in range(10)},
    )
    broker = Broker(fleet, WorkerClient(), placer)
    holder = types.SimpleNamespace(app={BROKER: broker, SEALER: sealer})
    call = functools.partial(machine_secrets, holder, APP, None, app)  # type: ignore[arg-type]
    out["open_10_secrets_us"] = cpu_us(call, 3000)
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,100,1000", help="workers in the region")
    parser.add_argument("--requests", type=int, default=600, help="creates per loaded phase")
    parser.add_argument("--sequential", type=int, default=200, help="creates one at a time")
    parser.add_argument("--concurrency", type=int, default=32, help="creates in flight")
    parser.add_argument(
        "--strategies", default=",".join(STRATEGIES), help="strategies to measure, comma-separated"
    )
    parser.add_argument("--quick", action="store_true", help="a short run (150 / 50 creates)")
    parser.add_argument("--http", action="store_true", help="the older mode: no NATS")
    parser.add_argument(
        "--secure",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="ROUNDS",
        help="also each size secured (signed catalog, mutual TLS to workers and on NATS, HTTPS"
        " API); ROUNDS pairs of plain and secured (default 1), the first of a pair alternating",
    )
    parser.add_argument(
        "--metrics-cost",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="ROUNDS",
        help="also each size with metrics off in the broker and its workers; ROUNDS pairs of "
        "plain and metrics off (default 1), the first of a pair alternating",
    )
    parser.add_argument(
        "--gc-cost",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="ROUNDS",
        help="also each size with Python's default garbage collector in the broker's and the "
        "workers' processes instead of heap.settle's; ROUNDS pairs (default 1), the first of a "
        "pair alternating",
    )
    parser.add_argument(
        "--reserve-over-bus",
        type=int,
        nargs="?",
        const=1,
        default=0,
        metavar="ROUNDS",
        help="also each size with the broker reserving on the bus (`souk broker "
        "--reserve-over-bus`) instead of over HTTP; ROUNDS pairs (default 1), the first of a "
        "pair alternating",
    )
    parser.add_argument(
        "--idle-seconds",
        type=float,
        default=10.0,
        help="how long the broker's idle CPU is measured (no creates), per size and mode",
    )
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    parser.add_argument(
        "--save", type=Path, help="also write the report as JSON here (for fleet_curves.py)"
    )
    parser.add_argument("--profile", type=Path, help="write cProfile stats of the broker here")
    parser.add_argument(
        "--cpu-sample",
        type=Path,
        help="write the broker's stacks sampled by CPU time here, one file of collapsed stacks"
        " per phase",
    )
    parser.add_argument(
        "--parts",
        action="store_true",
        help="only the broker's own parts of a create, each alone, in CPU µs (no cluster)",
    )
    args = parser.parse_args()
    if args.parts:
        print(json.dumps(create_parts()))
        return
    args.sizes = [int(s) for s in args.sizes.split(",")]
    args.strategies = [s for s in args.strategies.split(",") if s]
    if args.quick:
        args.requests, args.sequential = 150, 50
    err = Console(stderr=True)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    bar = RedrawnWhenTold(*columns, console=err, transient=args.json, auto_refresh=False)
    with bar as progress:
        report = run(measure(args, progress))  # the broker runs here, on its own loop
    if args.save is not None:
        args.save.write_text(json.dumps(asdict(report), indent=2))
    if args.json:
        print(json.dumps(asdict(report), indent=2))
        return
    out = Console(width=max(Console().width, 140))
    out.print(
        f"{report.cpus} cpus, Python {report.python}"
        + (f", nats-server {report.nats_server}" if report.nats_server else "")
    )
    for t in tables(report):
        out.print(t)
    out.print(
        f"goals: {GOAL_RATE:,.0f} placements/s; decision p99 < {GOAL_DECISION_P99_MS:.0f} ms at "
        "10,000 workers (its CPU p99 is the broker thread's own time in it, which a host whose "
        "cores are all busy does not stretch). 'host: others' is CPU used outside this "
        "benchmark's processes during the loaded phase (% of one core)."
    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        nats_url, tls_arg = sys.argv[5], sys.argv[6]
        serve = serve_workers(
            int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4]), nats_url,
            Path(tls_arg) if tls_arg else None, sys.argv[7] == "on", sys.argv[8] == "settle",
        )  # fmt: skip
        if len(sys.argv) > 9:  # a profile of the whole worker host, written as it stops
            cProfile.run("asyncio.run(serve)", sys.argv[9])
        else:
            asyncio.run(serve)
    elif len(sys.argv) > 1 and sys.argv[1] == "--load":
        asyncio.run(load(json.loads(sys.argv[2])))
    else:
        main()
