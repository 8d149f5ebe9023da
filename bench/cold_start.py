"""Cold start through the proxy: the first request to an app scaled to zero (the proxy starts a
machine through the broker and holds the request), next to the same app process started by hand
and polled until it answers, in one run. Also a request to the started app through the proxy
next to the same request sent to the machine directly. And `--concurrent` requests (20 by
default) sent at once to the app scaled to zero: each one's latency, p50 and p99 against the
single cold request's p50 (the goal: every waiter follows the one start, p99 <= 1.2x); and each
burst on its own, its slowest answer against its first and its first against the single cold
request of the same run, which tells the waiters' cost apart from how long each start took.

Everything runs on loopback in this process (two process-driver workers, a broker, catalog
replicas on an in-process bus, the proxy); the machines run `examples/hello/app.py`.
Run: python bench/cold_start.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import aiohttp
from rich.console import Console
from rich.table import Table

import _harness  # noqa: F401  (puts the repository root on the path, for tests.support)

from souk import heap
from souk.network import hostport
from souk.proxy.wake import port_open
from tests.support.hello import HELLO, PORT, hello_config
from tests.support.local_cluster import local_cluster
from tests.support.ports import free_port
from tests.support.waiting import eventually

WARM_REQUESTS = 50


async def answers(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as resp:
            await resp.read()
            return resp.status == 200
    except aiohttp.ClientError:
        return False


async def until_it_answers(http: aiohttp.ClientSession, host: str, port: int) -> None:
    """Polls the app's port as the proxy polls a machine it starts (every 2 ms at first), then
    asks it once. A poll by HTTP requests would leave each refusal's exception in reference
    cycles, and the collector's pause to free them would land in the measured requests of this
    process, which holds the proxy too."""
    assert await port_open(host, port, time.monotonic() + 20), f"{host}:{port} never accepted"
    assert await answers(http, f"http://{hostport(host, port)}/")


async def by_hand(http: aiohttp.ClientSession) -> float:
    """Spawn the app as a plain process and poll it until it answers; seconds taken."""
    port = free_port()
    env = {**os.environ, "PORT": str(port), "SOUK_PRIVATE_IP": "127.0.0.1"}
    t0 = time.perf_counter()
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        str(HELLO),
        env=env,
        stdout=asyncio.subprocess.DEVNULL,
        stderr=asyncio.subprocess.DEVNULL,
    )
    try:
        await until_it_answers(http, "127.0.0.1", port)
        return time.perf_counter() - t0
    finally:
        proc.kill()
        await proc.wait()


async def timed_get(http: aiohttp.ClientSession, url: str, headers: dict[str, str]) -> float:
    t0 = time.perf_counter()
    async with http.get(url, headers=headers) as resp:
        await resp.read()
        assert resp.status == 200, resp.status
    return time.perf_counter() - t0


async def run(runs: int, concurrent: int) -> tuple[dict[str, list[float]], dict[str, int]]:
    results: dict[str, list[float]] = {
        "cold": [],
        "concurrent": [],
        "broker": [],
        "hand": [],
        "warm": [],
        "direct": [],
        "burst_spread": [],  # ratios, not seconds: a burst's slowest answer over its first
        "burst_first": [],  # a burst's first answer over the run's single cold request
    }
    workers = [("mad1", "mad"), ("mad2", "mad")]
    with tempfile.TemporaryDirectory() as tmpdir:
        async with local_cluster(Path(tmpdir), workers, ["hello"], idle_timeout=3600) as c:
            http, url, proxy, replica, api = c.http, c.proxy_url, c.proxy, c.replica, c.api
            m = await c.create("hello", "mad", hello_config(), skip_launch=True)
            heap.settle()  # as each part does once it is ready, here all of them in one process
            mid, direct = m["id"], f"http://{hostport(m['private_ip'], PORT)}/"
            app = {"souk-app": "hello"}
            machine = f"/v1/apps/hello/machines/{mid}"

            async def stopped() -> bool:
                row = replica.machine(mid)
                return row is not None and row.state in ("created", "stopped")

            for _ in range(runs):
                await eventually(stopped, 20, every=0.01)
                results["cold"].append(await timed_get(http, url + "/", app))
                for _ in range(WARM_REQUESTS):
                    results["warm"].append(await timed_get(http, url + "/", app))
                    results["direct"].append(await timed_get(http, direct, {}))
                await api("POST", machine + "/stop", json={})
                await api("GET", machine + "/wait", params={"state": "stopped", "timeout": "20"})

                # The same start asked of the broker by hand, polled until the app answers.
                t0 = time.perf_counter()
                await api("POST", machine + "/start")
                await api("GET", machine + "/wait", params={"state": "started", "timeout": "20"})
                await until_it_answers(http, m["private_ip"], PORT)
                results["broker"].append(time.perf_counter() - t0)
                await api("POST", machine + "/stop", json={})
                await api("GET", machine + "/wait", params={"state": "stopped", "timeout": "20"})

                results["hand"].append(await by_hand(http))

                # Many requests at once to the app scaled to zero: one start, every one waits.
                await eventually(stopped, 20, every=0.01)
                burst = [timed_get(http, url + "/", app) for _ in range(concurrent)]
                answered = await asyncio.gather(*burst)
                results["concurrent"].extend(answered)
                results["burst_spread"].append(max(answered) / min(answered))
                results["burst_first"].append(min(answered) / results["cold"][-1])
                await api("POST", machine + "/stop", json={})
                await api("GET", machine + "/wait", params={"state": "stopped", "timeout": "20"})
            assert proxy.waker.starts == runs * 2
            stats = dict(proxy.forwarder.stats)
    return results, stats


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    parser.add_argument("--concurrent", type=int, default=20, help="requests in the cold burst")
    args = parser.parse_args()
    results, proxy_stats = asyncio.run(run(args.runs, args.concurrent))
    p50 = {k: statistics.median(v) * 1000 for k, v in results.items() if "burst_" not in k}
    table = Table(
        "request",
        "p50 ms",
        "min ms",
        "max ms",
        "ratio",
        title=f"cold start, {args.runs} runs (warm: {WARM_REQUESTS} requests per run)",
    )
    rows = [
        ("cold", "stopped app, through the proxy (starts it)", "hand"),
        ("broker", "broker start + wait + poll, by hand (no proxy)", "hand"),
        ("hand", "same app spawned by hand, polled until it answers", "hand"),
        ("warm", "started app, through the proxy", "direct"),
        ("direct", "started app, straight to the machine", "direct"),
    ]
    for key, label, base in rows:
        values = [v * 1000 for v in results[key]]
        table.add_row(
            label,
            f"{p50[key]:.1f}",
            f"{min(values):.1f}",
            f"{max(values):.1f}",
            f"{p50[key] / p50[base]:.2f}x {base}",
        )
    Console().print(table)
    burst = sorted(v * 1000 for v in results["concurrent"])
    p99 = burst[min(len(burst) - 1, round(0.99 * (len(burst) - 1)))]
    cold = p50["cold"]
    Console().print(
        f"{args.concurrent} concurrent cold requests x {args.runs} runs: p50"
        f" {statistics.median(burst):.1f} ms ({statistics.median(burst) / cold:.2f}x one cold"
        f" request), p99 {p99:.1f} ms ({p99 / cold:.2f}x), max {burst[-1]:.1f} ms;"
        f" proxy stats {proxy_stats}"
    )
    spread, first = sorted(results["burst_spread"]), sorted(results["burst_first"])
    Console().print(
        f"each burst: slowest over first answer median {statistics.median(spread):.2f}x, max"
        f" {spread[-1]:.2f}x; first answer over the run's single cold request median"
        f" {statistics.median(first):.2f}x, range {first[0]:.2f}-{first[-1]:.2f}x"
    )


if __name__ == "__main__":
    main()
