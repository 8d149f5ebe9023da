"""Placement throughput and latency through the broker, against 10, 100 and 1,000 workers.

Workers are the real worker code with the `sim` driver (it runs nothing), many per process, in
child processes; the broker runs in this process with the default policy. For each fleet size
and strategy it sends REQUESTS creates at CONCURRENCY in flight and prints placements/s and
p50/p99 create latency, next to raw reservations sent straight to one worker (no broker) in the
same run. Usage: .venv/bin/python bench/placement.py [--sizes 10,100,1000] [--requests 600]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
from aiohttp import web

from souk.broker.api import Broker
from souk.broker.fleet import StaticFleet
from souk.broker.placer import Placer
from souk.broker.registry import AppRegistry
from souk.broker.server import make_app
from souk.broker.tokens import mint
from souk.broker.workers import WorkerClient

SECRET = b"bench-secret-0123456789abcdef"
BODY = {
    "region": "bench",
    "config": {"init": {"exec": ["true"]}, "guest": {"cpus": 1, "memory_mb": 256}},
}
HOSTS = 2  # child processes hosting workers


async def serve_workers(count: int, offset: int, data_dir: Path) -> None:
    """Child process: `count` sim workers on loopback; prints one URL per line, then waits."""
    from souk.worker.daemon import make_app as worker_app
    from souk.worker.daemon import make_driver, running
    from souk.worker.engine import Engine
    from souk.worker.settings import WorkerSettings

    async with contextlib.AsyncExitStack() as stack:
        for i in range(offset, offset + count):
            s = WorkerSettings(
                name=f"w{i}",
                region="bench",
                data_dir=data_dir / f"w{i}",
                cpus=100_000,
                memory_mb=100_000_000,
                durable=False,
            )
            engine = await stack.enter_async_context(running(Engine(s, make_driver("sim", s))))
            runner = web.AppRunner(worker_app(engine), access_log=None)
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
            print(f"http://127.0.0.1:{runner.addresses[0][1]}", flush=True)
        print("ready", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.read)


@contextlib.contextmanager
def worker_hosts(total: int, data_dir: Path):  # type: ignore[no-untyped-def]
    procs, urls = [], []
    per = -(-total // HOSTS)
    for h in range(HOSTS):
        count = min(per, total - h * per)
        if count <= 0:
            continue
        p = subprocess.Popen(
            [sys.executable, __file__, "--serve", str(count), str(h * per), str(data_dir)],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        procs.append(p)
    try:
        for p in procs:
            assert p.stdout is not None
            for line in p.stdout:
                if line.strip() == "ready":
                    break
                urls.append(line.strip())
        yield urls
    finally:
        for p in procs:
            assert p.stdin is not None
            p.stdin.close()
            p.terminate()
            p.wait(10)


@contextlib.asynccontextmanager
async def broker(urls: list[str]) -> AsyncIterator[str]:
    client = WorkerClient()
    registry = AppRegistry()
    registry.create("bench")
    fleet = StaticFleet(urls, registry, client)
    await fleet.refresh(machines=False)
    b = Broker(fleet, client, Placer(fleet, client), registry=registry)
    runner = web.AppRunner(make_app(b, SECRET), access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0, backlog=1024).start()
    try:
        yield f"http://127.0.0.1:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


async def load(
    url: str, requests: int, concurrency: int, headers: dict[str, str], body: dict[str, object]
) -> tuple[float, list[float], int]:
    latencies: list[float] = []
    failures = 0
    todo = iter(range(requests))
    connector = aiohttp.TCPConnector(limit=concurrency)
    async with aiohttp.ClientSession(connector=connector, headers=headers) as session:

        async def one() -> None:
            nonlocal failures
            for _ in todo:
                t = time.perf_counter()
                async with session.post(url, json=body) as resp:
                    await resp.read()
                    if resp.status not in (200, 201):
                        failures += 1
                latencies.append(time.perf_counter() - t)

        start = time.perf_counter()
        await asyncio.gather(*(one() for _ in range(concurrency)))
        elapsed = time.perf_counter() - start
    return requests / elapsed, latencies, failures


def pct(xs: list[float], q: float) -> float:
    return statistics.quantiles(xs, n=100)[q - 1] * 1000 if len(xs) > 1 else 0.0


async def main(sizes: list[int], requests: int, concurrency: int) -> None:
    headers = {"Authorization": f"Bearer {mint(SECRET)}"}
    print(
        f"{'workers':>8} {'strategy':>9} {'placements/s':>13} {'p50 ms':>8} {'p99 ms':>8}"
        f" {'vs raw':>7} {'failed':>6}"
    )
    for size in sizes:
        with tempfile.TemporaryDirectory() as tmp, worker_hosts(size, Path(tmp)) as urls:
            raw_rate, raw_lat, raw_fail = await load(
                urls[0] + "/v1/machines",
                requests,
                concurrency,
                {},
                {"app": "bench", "config": BODY["config"]},
            )
            print(
                f"{size:>8} {'raw':>9} {raw_rate:>13.0f} {pct(raw_lat, 50):>8.1f}"
                f" {pct(raw_lat, 99):>8.1f} {1.0:>7.2f} {raw_fail:>6}",
                flush=True,
            )
            async with broker(urls) as base:
                for strategy in ("offers", "p2c", "catalog"):
                    url = f"{base}/v1/apps/bench/machines?strategy={strategy}"
                    rate, lat, fail = await load(url, requests, concurrency, headers, BODY)
                    print(
                        f"{size:>8} {strategy:>9} {rate:>13.0f} {pct(lat, 50):>8.1f}"
                        f" {pct(lat, 99):>8.1f} {rate / raw_rate:>7.2f} {fail:>6}",
                        flush=True,
                    )


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--serve":
        asyncio.run(serve_workers(int(sys.argv[2]), int(sys.argv[3]), Path(sys.argv[4])))
        raise SystemExit(0)
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--sizes", default="10,100,1000")
    parser.add_argument("--requests", type=int, default=600)
    parser.add_argument("--concurrency", type=int, default=32)
    args = parser.parse_args()
    print(f"cpus: {os.cpu_count()}, python {sys.version.split()[0]}")
    asyncio.run(main([int(s) for s in args.sizes.split(",")], args.requests, args.concurrency))
