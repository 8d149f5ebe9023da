"""Stopping one machine of many: what a stop costs a worker, and what it costs the worker's
other requests, as the number of machines running beside it grows.

A process-driver `souk worker` runs `--running` machines (`sleep 60`), then `--stops` of them are
stopped one at a time (POST .../stop, then GET .../wait?state=stopped). Meanwhile a prober asks
the same worker for its capacity every 2 ms: how long those answers take while stops run is how
long a stop holds the event loop (every other machine's requests wait as long). Each size runs
on a fresh worker; the worker's CPU per stop is its own and its children's.

Usage: .venv/bin/python bench/stops.py [--running 100,1000] [--stops 100] [--json]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from rich.progress import Progress
from rich.table import Table

from _harness import cpu_ms, pct, progress_bar, report, workdir, worker_process

CONFIG = {
    "init": {"exec": ["sleep", "60"]},
    "guest": {"cpus": 1, "memory_mb": 16},
    "restart": {"policy": "no"},
}
PROBE_EVERY = 0.002


@dataclass
class Row:
    running: int
    stops: int
    stop_p50_ms: float
    stop_p99_ms: float
    cpu_ms_per_stop: float
    probe_p50_ms: float
    probe_p99_ms: float
    probe_max_ms: float


async def create(session: aiohttp.ClientSession, url: str) -> str:
    body = {"app": "bench", "config": CONFIG}
    async with session.post(url + "/v1/machines", json=body) as resp:
        machine = await resp.json()
        if resp.status != 201:
            raise SystemExit(f"create failed: {resp.status} {machine}")
    wait = f"{url}/v1/machines/{machine['id']}/wait?state=started&timeout=30"
    async with session.get(wait) as resp:
        await resp.read()
    return str(machine["id"])


async def stop(session: aiohttp.ClientSession, url: str, machine_id: str) -> float:
    began = time.perf_counter()
    async with session.post(f"{url}/v1/machines/{machine_id}/stop") as resp:
        if resp.status != 200:
            raise SystemExit(f"stop failed: {resp.status} {await resp.text()}")
    wait = f"{url}/v1/machines/{machine_id}/wait?state=stopped&timeout=30"
    async with session.get(wait) as resp:
        await resp.read()
    return time.perf_counter() - began


async def probe(session: aiohttp.ClientSession, url: str, into: list[float]) -> None:
    while True:
        began = time.perf_counter()
        async with session.get(url + "/v1/capacity") as resp:
            await resp.read()
        into.append(time.perf_counter() - began)
        await asyncio.sleep(PROBE_EVERY)


async def one_size(running: int, stops: int, work: Path, progress: Progress) -> Row:
    task = progress.add_task(f"{running} running: create", total=running)
    async with worker_process("process", work / f"w-{running}", True) as w:
        connector = aiohttp.TCPConnector(limit=16)
        async with aiohttp.ClientSession(connector=connector) as session:
            ids: list[str] = []

            async def creator(share: list[int]) -> None:
                for _ in share:
                    ids.append(await create(session, w.url))
                    progress.advance(task)

            await asyncio.gather(*(creator(list(range(i, running, 8))) for i in range(8)))
            progress.update(task, description=f"{running} running: stop", completed=0, total=stops)
            probes: list[float] = []
            prober = asyncio.ensure_future(probe(session, w.url, probes))
            took: list[float] = []
            began = cpu_ms(w.pid)
            for machine_id in ids[:stops]:
                took.append(await stop(session, w.url, machine_id))
                progress.advance(task)
            used = cpu_ms(w.pid) - began
            prober.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await prober
    return Row(
        running,
        len(took),
        pct(took, 50),
        pct(took, 99),
        used / len(took),
        pct(probes, 50),
        pct(probes, 99),
        max(probes) * 1000,
    )


async def measure(sizes: list[int], stops: int, progress: Progress) -> list[Row]:
    with workdir() as tmp:
        return [await one_size(n, min(stops, n), Path(tmp), progress) for n in sizes]


def table(rows: list[Row]) -> Table:
    out = Table(title="stopping one machine of many (process driver, one stop at a time)")
    for name in ("running", "stops", "stop p50 / p99 ms", "worker CPU ms/stop"):
        out.add_column(name, justify="right")
    out.add_column("other requests meanwhile: p50 / p99 / max ms", justify="right")
    for r in rows:
        out.add_row(
            f"{r.running:,}",
            str(r.stops),
            f"{r.stop_p50_ms:.1f} / {r.stop_p99_ms:.1f}",
            f"{r.cpu_ms_per_stop:.2f}",
            f"{r.probe_p50_ms:.2f} / {r.probe_p99_ms:.2f} / {r.probe_max_ms:.1f}",
        )
    return out


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--running", default="100,1000", help="machines running, per size")
    parser.add_argument("--stops", type=int, default=100, help="stops timed per size")
    parser.add_argument("--json", action="store_true", help="print the rows as JSON")
    args = parser.parse_args()
    sizes = [int(s) for s in args.running.split(",")]
    with progress_bar(args.json) as progress:
        rows = asyncio.run(measure(sizes, args.stops, progress))
    report(rows, table(rows), args.json)


if __name__ == "__main__":
    main()
