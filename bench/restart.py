"""How fast a crashed process runs again: a `souk worker` (restart policy `always`) next to
supervisord (`autorestart`) and, as the floor, a bare asyncio loop that respawns its child the
moment it exits; in one run.

Every supervised process is `sh -c 'echo "$$ $(date +%s%N)" >> FILE; exec sleep 600'`: it writes
down its pid and the moment it began. The bench kills it with SIGKILL, notes the time, and waits
for the next line in its file; the restart time runs from the kill to the new process's first
moment, timed by the process itself, so the bench's own polling adds nothing. Each process is
killed once (a souk machine's first crash restarts at once; a crash streak backs off).

Usage: .venv/bin/python bench/restart.py [--crashes 30] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import functools
import os
import signal
import subprocess
import sys
import time
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rich.progress import Progress
from rich.table import Table

from _harness import pct, progress_bar, report, workdir, worker

SUPERVISORD = Path(sys.executable).parent / "supervisord"
POLL = 0.005


@dataclass
class Row:
    supervisor: str
    crashes: int
    p50_ms: float
    p99_ms: float
    max_ms: float
    faster: float = 0.0  # supervisord's p50 over this one's


def command(starts: Path) -> list[str]:
    return ["sh", "-c", f'echo "$$ $(date +%s%N)" >> {starts}; exec sleep 600']


def starts_of(path: Path) -> list[tuple[int, int]]:
    """(pid, began at in ns) of each process that ran with this file."""
    with contextlib.suppress(FileNotFoundError):
        lines = path.read_text().splitlines()
        return [(int(pid), int(ns)) for pid, ns in (line.split() for line in lines if " " in line)]
    return []


async def started(path: Path, count: int, timeout: float = 30.0) -> list[tuple[int, int]]:
    deadline = time.monotonic() + timeout
    while len(found := starts_of(path)) < count:
        if time.monotonic() > deadline:
            raise SystemExit(f"no process {count} in {path} after {timeout} s")
        await asyncio.sleep(POLL)
    return found


async def crash_each(files: list[Path], advance: Callable[[], None]) -> list[float]:
    """Kill each file's process once; seconds until its successor began, in order."""
    took = []
    for path in files:
        (pid, _), *_ = await started(path, 1)
        killed = time.time_ns()
        os.kill(pid, signal.SIGKILL)
        again = (await started(path, 2))[1][1]
        took.append((again - killed) / 1e9)
        advance()
    return took


def kill_all(files: list[Path]) -> None:
    for path in files:
        for pid, _ in starts_of(path):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


# --- the supervisors ---------------------------------------------------------------------------

Run = Callable[[list[Path], Callable[[], None]], Awaitable[list[float]]]


async def bare(files: list[Path], advance: Callable[[], None]) -> list[float]:
    async def keep(path: Path) -> None:
        while True:
            proc = await asyncio.create_subprocess_exec(
                *command(path), stdin=subprocess.DEVNULL, start_new_session=True
            )
            await proc.wait()

    loops = [asyncio.create_task(keep(path)) for path in files]
    try:
        return await crash_each(files, advance)
    finally:
        for loop in loops:
            loop.cancel()
        kill_all(files)


async def supervisord(files: list[Path], advance: Callable[[], None]) -> list[float]:
    work = files[0].parent
    config = [
        "[supervisord]",
        "nodaemon=true",
        f"logfile={work / 'supervisord.log'}",
        f"pidfile={work / 'supervisord.pid'}",
    ]
    for i, path in enumerate(files):
        argv = " ".join(f"'{arg}'" if " " in arg else arg for arg in command(path))
        config += [
            f"[program:p{i}]",
            f"command={argv.replace('%', '%%')}",  # supervisord expands %(name)s in its config
            "autorestart=true",
            "startsecs=0",
            f"stdout_logfile={work / f'p{i}.log'}",
        ]
    (work / "supervisord.conf").write_text("\n".join(config) + "\n")
    proc = await asyncio.create_subprocess_exec(
        str(SUPERVISORD), "-c", str(work / "supervisord.conf"), stdin=subprocess.DEVNULL
    )
    try:
        return await crash_each(files, advance)
    finally:
        proc.send_signal(signal.SIGTERM)
        await proc.wait()
        kill_all(files)


async def souk(files: list[Path], advance: Callable[[], None]) -> list[float]:
    async with worker("process", files[0].parent / "worker", fsync=True) as url:
        async with aiohttp.ClientSession() as session:
            for path in files:
                config = {
                    "init": {"exec": command(path)},
                    "guest": {"cpus": 1, "memory_mb": 16},
                    "restart": {"policy": "always"},
                }
                body = {"app": "bench", "config": config}
                async with session.post(url + "/v1/machines", json=body) as resp:
                    if resp.status != 201:
                        raise SystemExit(f"create failed: {resp.status} {await resp.text()}")
        return await crash_each(files, advance)


SUPERVISORS: dict[str, Run] = {"bare loop": bare, "supervisord": supervisord, "souk worker": souk}


# --- the run -----------------------------------------------------------------------------------


async def measure(crashes: int, progress: Progress) -> list[Row]:
    rows = []
    with workdir() as tmp:
        Path(tmp).chmod(0o711)  # a root worker runs its machines as the app's own user
        for name, run in SUPERVISORS.items():
            work = Path(tmp, name.replace(" ", "-"))
            work.mkdir(mode=0o711)
            files = [work / f"starts-{i}" for i in range(crashes)]
            for path in files:  # made here, open to that user: it may not make files here
                path.touch()
                path.chmod(0o666)
            task = progress.add_task(name, total=crashes)
            took = await run(files, functools.partial(progress.advance, task))
            rows.append(Row(name, crashes, pct(took, 50), pct(took, 99), max(took) * 1000))
    base = next(row for row in rows if row.supervisor == "supervisord")
    for row in rows:
        row.faster = base.p50_ms / row.p50_ms
    return rows


def table(rows: list[Row]) -> Table:
    out = Table(title="from SIGKILL to the successor's first moment")
    for name in ("supervisor", "crashes", "p50 ms", "p99 ms", "max ms", "vs supervisord"):
        out.add_column(name, justify="left" if name == "supervisor" else "right")
    for r in rows:
        cells = (r.p50_ms, r.p99_ms, r.max_ms)
        out.add_row(
            r.supervisor,
            str(r.crashes),
            *(f"{c:.1f}" for c in cells),
            f"{r.faster:.0f}x faster" if r.faster > 1.5 else f"{r.faster:.2f}",
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--crashes", type=int, default=30, help="per supervisor (default 30)")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    with progress_bar(args.json) as progress:
        rows = asyncio.run(measure(args.crashes, progress))
    report(rows, table(rows), args.json, width=110)


if __name__ == "__main__":
    main()
