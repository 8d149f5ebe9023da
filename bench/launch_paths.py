"""Create+start of a command machine on a root worker, one worker for each way of starting the
machine's process, the workers side by side and their requests taken in turn, one at a time, so
that every way meets the same moments of the host (on a shared disk, creating a file here moved
from 20 µs to 1 ms within minutes). A bare spawn of the same command takes its turn too.

The ways:
  launch   as souk starts a machine: by souk-launch's server, which forks the machine's process
           from itself; the child joins the machine's cgroups, drops to the app's ids and runs
           the command
  fork     without souk-launch: Python changes the ids and a preexec_fn joins the groups, for
           which Python forks the whole worker
  as-root  through souk-launch, joining the groups but keeping root's ids: not a way souk runs
           a machine, the baseline for what running it as its app costs (security may cost at
           most 20% of any figure)
  unconfined  by souk-launch's server, as root and in no group: what a start costs without
           the trust boundary (the groups are made all the same)
  bare     asyncio's create_subprocess_exec of the command, as root, nothing else (the baseline
           of the create+start goal: at most 3x)

Each create is timed until the machine runs (a create with `start: true` answers then), fsync
on. Needs root, cgroups to write for the groups, and souk-launch (scripts/setup.sh builds it).

Usage: .venv/bin/python bench/launch_paths.py [--rounds 300] [--dir DIR] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rich.table import Table

from _harness import progress_bar, report, workdir, worker_process

from souk.worker.drivers import launcher
from worker_ops import COMMAND, CONFIG

WARMUP = 20
# How each worker is run: `souk`, with the way it starts machines changed before it starts.
PATCHES = {
    "launch": "",
    "fork": "import souk.worker.drivers.launcher as l\nl.LAUNCHER = None\n",
    "as-root": (
        "import souk.worker.drivers.spawner as s\nf = s.Spawner.spawn\n"
        "s.Spawner.spawn = lambda self, command, *a: f(self, command._replace(user=None), *a)\n"
    ),
    "unconfined": (
        "import souk.worker.drivers.spawner as s\nf = s.Spawner.spawn\n"
        "s.Spawner.spawn = lambda self, c, cwd, out, procs: f(self, c._replace(user=None), cwd,"
        " out, [])\n"
    ),
}


@dataclass
class Row:
    way: str
    creates: int
    p50_ms: float
    p90_ms: float
    mean_ms: float
    vs_bare: float = 0.0
    vs_as_root: float = 0.0
    vs_unconfined: float = 0.0


def souk(patch: str) -> list[str]:
    return [sys.executable, "-c", f"{patch}from souk.cli.main import app\napp()"]


async def bare(workdir: Path) -> float:
    """One spawn as the process driver makes it (own session, output to files); then killed."""
    env = {"PATH": os.environ.get("PATH", "/usr/bin:/bin"), "LANG": "C.UTF-8"}
    began = time.perf_counter()
    with open(workdir / "stdout.log", "ab") as out, open(workdir / "stderr.log", "ab") as err:
        proc = await asyncio.create_subprocess_exec(
            *COMMAND, stdout=out, stderr=err, cwd=workdir, env=env, start_new_session=True
        )
    took = time.perf_counter() - began
    proc.kill()
    await proc.wait()
    return took


async def measure(rounds: int, advance: Callable[[], None], where: Path | None) -> list[Row]:
    async with contextlib.AsyncExitStack() as stack:
        tmp = stack.enter_context(workdir(where))
        tmp.chmod(0o711)  # the app's user passes through to its home
        ways: dict[str, Callable[[], Awaitable[float]]] = {"bare": lambda: bare(tmp)}
        session = await stack.enter_async_context(aiohttp.ClientSession())
        for name, patch in PATCHES.items():
            w = await stack.enter_async_context(
                worker_process("process", tmp / name, True, souk=souk(patch))
            )
            ways[name] = create_start(session, w.url)
        for one in ways.values():
            for _ in range(WARMUP):
                await one()
        took: dict[str, list[float]] = {name: [] for name in ways}
        names = list(ways)
        for r in range(rounds):
            for name in names[r % len(names) :] + names[: r % len(names)]:
                took[name].append(await ways[name]())
            advance()
    rows = [
        Row(
            name,
            len(xs),
            statistics.median(xs) * 1e3,
            sorted(xs)[int(len(xs) * 0.9)] * 1e3,
            statistics.mean(xs) * 1e3,
        )
        for name, xs in took.items()
    ]
    by = {row.way: row for row in rows}
    for row in rows:
        row.vs_bare = row.p50_ms / by["bare"].p50_ms
        row.vs_as_root = row.p50_ms / by["as-root"].p50_ms
        row.vs_unconfined = row.p50_ms / by["unconfined"].p50_ms
    return rows


def create_start(session: aiohttp.ClientSession, url: str) -> Callable[[], Awaitable[float]]:
    body = {"app": "bench", "config": CONFIG}

    async def one() -> float:
        began = time.perf_counter()
        async with session.post(url + "/v1/machines", json=body) as resp:
            machine = await resp.json()
            if resp.status != 201 or machine["state"] != "started":
                raise SystemExit(f"create failed: {resp.status} {machine}")
        return time.perf_counter() - began

    return one


def table(rows: list[Row]) -> Table:
    out = Table(title="create+start of `sleep 60`, one at a time, the ways taken in turn")
    names = ("way", "creates", "p50 ms", "p90 ms", "mean ms", "p50 vs bare", "vs as-root")
    for name in (*names, "vs unconfined"):
        out.add_column(name, justify="left" if name == "way" else "right")
    for r in rows:
        cells = [f"{r.p50_ms:.2f}", f"{r.p90_ms:.2f}", f"{r.mean_ms:.2f}", f"{r.vs_bare:.2f}"]
        out.add_row(r.way, str(r.creates), *cells, f"{r.vs_as_root:.2f}", f"{r.vs_unconfined:.2f}")
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--rounds", type=int, default=300, help="creates per way (default 300)")
    parser.add_argument(
        "--dir", type=Path, help="where the workers keep their data (default: system temp)"
    )
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    if os.geteuid() != 0 or launcher.LAUNCHER is None:
        raise SystemExit("needs root and souk-launch (scripts/setup.sh builds it)")
    with progress_bar(args.json) as progress:
        task = progress.add_task("rounds", total=args.rounds)
        rows = asyncio.run(measure(args.rounds, lambda: progress.advance(task), args.dir))
    report(rows, table(rows), args.json)


if __name__ == "__main__":
    main()
