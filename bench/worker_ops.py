"""Create+start of command machines through a real `souk worker` process, next to spawning the
same command with bare `asyncio.create_subprocess_exec`, in one run.

Each worker row sends POST /v1/machines (start: true) and, unless its answer says the machine is
started already (a worker that answers a create once its machine runs), waits (GET .../wait) until
the machine runs: the latency a client sees from asking to a running process, including the
worker's SQLite commits (with fsync unless --no-fsync). The `process` driver really spawns
`sleep 60`; the `sim` driver runs nothing, so its rows are the worker's own overhead apart from
spawning. Each is measured one at a time (latency) and with --concurrency in flight
(throughput). Every machine and process is destroyed afterwards.

`--metrics-cost [ROUNDS]` measures each worker row with a worker with metrics on and one started
with `--no-metrics`, back to back, ROUNDS times (3 by default; which goes first alternates), and
adds a table of the ratios, on over off: the median of the rounds and their spread.

Usage: .venv/bin/python bench/worker_ops.py [--machines 200] [--concurrency 16] [--dir DIR]
       [--metrics-cost [ROUNDS]] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import json
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp
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

from _harness import cpu_ms, machine_info, pct, workdir, worker_process

COMMAND = ["sleep", "60"]
OFF = " (metrics off)"
CONFIG = {
    "init": {"exec": COMMAND},
    "guest": {"cpus": 1, "memory_mb": 16},
    "restart": {"policy": "no"},
}


@dataclass
class Row:
    path: str
    in_flight: int
    ops: int
    p50_ms: float
    p99_ms: float
    per_s: float
    accept_p50_ms: float | None = None  # worker rows: until the create is acknowledged
    vs_bare: float = 0.0  # p50 over the bare spawn's p50 at the same concurrency
    rate_vs_bare: float = 0.0  # per second over the bare spawn's, at the same concurrency
    cpu_ms_per_op: float | None = None  # worker rows: its CPU, its launcher's, its reaped children
    round: int = 0  # --metrics-cost: which round of on and off


async def drive(
    n: int, concurrency: int, one: Callable[[], Awaitable[float]], advance: Callable[[], None]
) -> tuple[list[float], float]:
    """`n` calls of `one` with `concurrency` in flight: their latencies and the wall time."""
    latencies: list[float] = []
    todo = iter(range(n))

    async def runner() -> None:
        for _ in todo:
            latencies.append(await one())
            advance()

    began = time.perf_counter()
    await asyncio.gather(*(runner() for _ in range(concurrency)))
    return latencies, time.perf_counter() - began


# --- the baseline: spawning the command bare -----------------------------------------------------


async def bare_spawns(
    n: int, concurrency: int, workdir: Path, advance: Callable[[], None]
) -> tuple[list[float], float]:
    """Spawns as the process driver does (own session, output to files), then kills them all."""
    procs: list[asyncio.subprocess.Process] = []
    workdir.mkdir(parents=True, exist_ok=True)
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}

    async def one() -> float:
        began = time.perf_counter()
        with open(workdir / "stdout.log", "ab") as out, open(workdir / "stderr.log", "ab") as err:
            proc = await asyncio.create_subprocess_exec(
                *COMMAND,
                stdin=asyncio.subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                cwd=workdir,
                env=env,
                start_new_session=True,
            )
        took = time.perf_counter() - began
        procs.append(proc)
        return took

    try:
        return await drive(n, concurrency, one, advance)
    finally:
        for proc in procs:
            with contextlib.suppress(ProcessLookupError):
                proc.kill()
        await asyncio.gather(*(proc.wait() for proc in procs))


async def create_starts(
    url: str, n: int, concurrency: int, advance: Callable[[], None]
) -> tuple[list[float], list[float], float]:
    """`n` machines created with start: true, each timed until it runs; also the time until
    each create was acknowledged."""
    accepted: list[float] = []
    body = {"app": "bench", "config": CONFIG}
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector) as session:

        async def one() -> float:
            began = time.perf_counter()
            async with session.post(url + "/v1/machines", json=body) as resp:
                machine = await resp.json()
                if resp.status != 201:
                    raise SystemExit(f"create failed: {resp.status} {machine}")
            accepted.append(time.perf_counter() - began)
            if machine["state"] == "started":  # answered once it ran: nothing to wait for
                return time.perf_counter() - began
            wait = f"{url}/v1/machines/{machine['id']}/wait?state=started&timeout=30"
            async with session.get(wait) as resp:
                if resp.status != 200:
                    raise SystemExit(f"machine did not start: {await resp.text()}")
                await resp.read()
            return time.perf_counter() - began

        latencies, elapsed = await drive(n, concurrency, one, advance)
    return latencies, accepted, elapsed


# --- the run -------------------------------------------------------------------------------------


async def measure(
    n: int,
    concurrency: int,
    fsync: bool,
    progress: Progress,
    rounds: int = 0,
    where: Path | None = None,
) -> list[Row]:
    """The rows; with `rounds`, each worker row that many times with metrics on and off, which
    goes first alternating from one round to the next. `where`: the directory the workers keep
    their data in (the system's temporary directory by default)."""
    rows: list[Row] = []
    levels = [1, concurrency]
    with workdir(where) as tmp:
        work = Path(tmp)
        for c in levels:  # each level's rows back to back, so that their ratios share a moment
            task = progress.add_task(f"bare spawn, {c} in flight", total=n)
            lat, elapsed = await bare_spawns(n, c, work / f"bare-{c}", advancer(progress, task))
            rows.append(Row("bare spawn", c, n, pct(lat, 50), pct(lat, 99), n / elapsed))
            for driver in ("process", "sim"):
                for r in range(max(1, rounds)):  # on and off back to back, for the same reason
                    for metrics in switches(rounds, r):
                        row = await worker_row(driver, metrics, n, c, fsync, work, progress)
                        row.round = r
                        rows.append(row)
    bare = {row.in_flight: row for row in rows if row.path == "bare spawn"}
    for row in rows:
        base = bare[row.in_flight]
        row.vs_bare = row.p50_ms / base.p50_ms if base.p50_ms else 0.0
        row.rate_vs_bare = row.per_s / base.per_s if base.per_s else 0.0
    return rows


def switches(rounds: int, r: int) -> tuple[bool, ...]:
    """Metrics on only; or, measuring their cost, on and off with the first alternating."""
    if not rounds:
        return (True,)
    return (True, False) if r % 2 == 0 else (False, True)


async def worker_row(
    driver: str, metrics: bool, n: int, c: int, fsync: bool, work: Path, progress: Progress
) -> Row:
    """`n` create+starts through a fresh worker, `c` in flight; `metrics=False`: `--no-metrics`."""
    path = f"worker/{driver}" + ("" if metrics else OFF)
    data_dir = work / f"{driver}-{c}-{'on' if metrics else 'off'}-{len(progress.tasks)}"
    task = progress.add_task(f"{path}, {c} in flight", total=n)
    extra = () if metrics else ("--no-metrics",)
    async with worker_process(driver, data_dir, fsync, extra) as w:
        began = cpu_ms(w.pid)
        lat, acc, elapsed = await create_starts(w.url, n, c, advancer(progress, task))
        used = cpu_ms(w.pid) - began
    row = Row(path, c, n, pct(lat, 50), pct(lat, 99), n / elapsed, accept_p50_ms=pct(acc, 50))
    row.cpu_ms_per_op = used / n
    return row


# What --metrics-cost sets on against off: each row's figure, by the name of its ratio.
RATIOS: dict[str, Callable[[Row], float]] = {
    "p50": lambda r: r.p50_ms,
    "rate": lambda r: r.per_s,
    "cpu": lambda r: r.cpu_ms_per_op or 0.0,
}


def costs(rows: list[Row]) -> list[dict[str, Any]]:
    """Each worker row with metrics on over its twin of the same round with them off, for each of
    `RATIOS`: the median of the rounds and their spread (lowest, highest)."""
    off = {(r.path, r.in_flight, r.round): r for r in rows if r.path.endswith(OFF)}
    pairs: dict[tuple[str, int], list[tuple[Row, Row]]] = {}
    for on in rows:
        twin = off.get((on.path + OFF, on.in_flight, on.round))
        if twin is not None:
            pairs.setdefault((on.path, on.in_flight), []).append((on, twin))
    out: list[dict[str, Any]] = []
    for (path, c), both in pairs.items():
        cost: dict[str, Any] = {"path": path, "in_flight": c, "rounds": len(both)}
        for name, figure in RATIOS.items():
            ratios = sorted(figure(a) / figure(b) if figure(b) else 0.0 for a, b in both)
            cost[name] = {"median": statistics.median(ratios), "spread": [ratios[0], ratios[-1]]}
        out.append(cost)
    return out


def advancer(progress: Progress, task: TaskID) -> Callable[[], None]:
    return lambda: progress.advance(task)


def table(rows: list[Row], fsync: bool) -> Table:
    out = Table(title=f"create+start of `{' '.join(COMMAND)}` (fsync {'on' if fsync else 'off'})")
    for name in (
        "path",
        "in flight",
        "ops",
        "p50 ms",
        "p99 ms",
        "per s",
        "accept p50 ms",
        "CPU ms/op",
        "p50 vs bare",
        "per s vs bare",
    ):
        out.add_column(name, justify="left" if name == "path" else "right")
    for row in rows:
        out.add_row(
            row.path,
            str(row.in_flight),
            str(row.ops),
            f"{row.p50_ms:.2f}",
            f"{row.p99_ms:.2f}",
            f"{row.per_s:.0f}",
            "" if row.accept_p50_ms is None else f"{row.accept_p50_ms:.2f}",
            "" if row.cpu_ms_per_op is None else f"{row.cpu_ms_per_op:.2f}",
            f"{row.vs_bare:.1f}",
            f"{row.rate_vs_bare:.2f}",
        )
    return out


def cost_table(found: list[dict[str, Any]]) -> Table:
    out = Table(
        title="what metrics cost: on over off, in the same run (goal: within 5%); "
        "median of the rounds (lowest-highest)"
    )
    for name in ("path", "in flight", "rounds", "p50", "per s", "worker CPU/op"):
        out.add_column(name, justify="left" if name == "path" else "right")
    for c in found:
        ratios = [c[name] for name in RATIOS]
        out.add_row(
            c["path"],
            str(c["in_flight"]),
            str(c["rounds"]),
            *(f"{r['median']:.3f} ({r['spread'][0]:.2f}-{r['spread'][1]:.2f})" for r in ratios),
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--machines", type=int, default=200, help="per row (default 200)")
    parser.add_argument("--concurrency", type=int, default=16, help="in flight (default 16)")
    parser.add_argument("--no-fsync", action="store_true", help="run the workers with --no-fsync")
    parser.add_argument(
        "--dir",
        type=Path,
        help="where the workers keep their data (default: the system's temporary directory); "
        "the disk a worker would use, or tmpfs to leave the disk out",
    )
    parser.add_argument(
        "--metrics-cost",
        type=int,
        nargs="?",
        const=3,
        default=0,
        metavar="ROUNDS",
        help="each worker row with metrics on and with --no-metrics, ROUNDS times (default 3), "
        "and their ratios",
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    err = Console(stderr=True)
    columns = (
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TimeElapsedColumn(),
    )
    with Progress(*columns, console=err, transient=args.json) as progress:
        rows = asyncio.run(
            measure(
                args.machines,
                args.concurrency,
                not args.no_fsync,
                progress,
                args.metrics_cost,
                args.dir,
            )
        )
    found = costs(rows)
    if args.json:
        report = {"machine": machine_info(), "rows": [asdict(r) for r in rows], "costs": found}
        print(json.dumps(report, indent=2))
        return
    console = Console() if sys.stdout.isatty() else Console(width=120)
    console.print(machine_info())
    console.print(table(rows, not args.no_fsync))
    if found:
        console.print(cost_table(found))


if __name__ == "__main__":
    main()
