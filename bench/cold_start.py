"""Cold start through the proxy: the first request to an app scaled to zero (the proxy starts a
machine through the broker and holds the request), next to the same app process started by hand
and polled until it answers, in one run. Also a request to the started app through the proxy
next to the same request sent to the machine directly.

Everything runs on loopback in this process (two process-driver workers, a broker, catalog
replicas on an in-process bus, the proxy); the machines run `examples/hello/app.py`.
Run: python bench/cold_start.py [--runs N]
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import os
import socket
import statistics
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web
from rich.console import Console
from rich.table import Table

from souk.broker.runtime import BrokerOptions, broker_site
from souk.broker.tokens import mint, new_secret
from souk.catalog.bus import InProcessBus
from souk.catalog.replica import Replica
from souk.proxy.server import Proxy, ProxyOptions, proxy_site
from souk.worker.daemon import make_app, make_driver, offering, publishing, running
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings

HELLO = Path(__file__).resolve().parents[1] / "examples" / "hello" / "app.py"
PORT = 8080
WARM_REQUESTS = 50


def hello_config() -> dict[str, Any]:
    return {
        "init": {"exec": [sys.executable, str(HELLO)]},
        "env": {"PORT": str(PORT)},
        "restart": {"policy": "no"},
        "services": [{"internal_port": PORT, "autostop": "stop"}],
    }


@contextlib.asynccontextmanager
async def cluster(tmp: Path) -> AsyncIterator[tuple[str, str, Proxy, str, Replica]]:
    """Broker URL, token, the proxy, its URL and its replica."""
    secret = new_secret()
    async with contextlib.AsyncExitStack() as stack:
        bus = InProcessBus()
        stack.push_async_callback(bus.close)
        urls: list[str] = []
        engines: list[Engine] = []
        for n in (1, 2):
            settings = WorkerSettings(
                name=f"mad{n}",
                region="mad",
                data_dir=tmp / f"mad{n}",
                cpus=4,
                memory_mb=4096,
                durable=False,
            )
            engine = await stack.enter_async_context(
                running(Engine(settings, make_driver("process", settings)))
            )
            engines.append(engine)
            runner = web.AppRunner(make_app(engine), access_log=None)
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            urls.append(f"http://127.0.0.1:{runner.addresses[0][1]}")
            await stack.enter_async_context(publishing(engine, bus, urls[-1]))
            await stack.enter_async_context(offering(engine, bus))
        opts = BrokerOptions("127.0.0.1", 0, secret, urls, registry_dir=tmp / "registry")
        broker = await stack.enter_async_context(broker_site(opts, bus))
        token = mint(secret, operator=True)
        replica = Replica(bus)
        await replica.start(bootstrap=False)
        stack.push_async_callback(replica.stop)
        popts = ProxyOptions(port=0, api=broker, token=token, region="mad", idle_timeout=3600)
        proxy, url = await stack.enter_async_context(proxy_site(replica, popts))
        yield broker, token, proxy, url, replica


async def until(check: Callable[[], Awaitable[bool]], timeout: float = 20.0) -> None:
    deadline = time.monotonic() + timeout
    while not await check():
        if time.monotonic() > deadline:
            raise RuntimeError("condition not reached in time")
        await asyncio.sleep(0.01)


async def answers(http: aiohttp.ClientSession, url: str) -> bool:
    try:
        async with http.get(url) as resp:
            await resp.read()
            return resp.status == 200
    except aiohttp.ClientError:
        return False


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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
        url = f"http://127.0.0.1:{port}/"
        while not await answers(http, url):
            await asyncio.sleep(0.002)
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


async def run(runs: int) -> dict[str, list[float]]:
    results: dict[str, list[float]] = {
        "cold": [],
        "broker": [],
        "hand": [],
        "warm": [],
        "direct": [],
    }
    with tempfile.TemporaryDirectory() as tmpdir:
        async with (
            cluster(Path(tmpdir)) as (broker, token, proxy, url, replica),
            aiohttp.ClientSession() as http,
        ):
            auth = {"Authorization": f"Bearer {token}"}

            async def api(method: str, path: str, **kw: Any) -> Any:
                async with http.request(method, broker + path, headers=auth, **kw) as resp:
                    assert resp.status in (200, 201), await resp.text()
                    return await resp.json()

            await api("POST", "/v1/apps", json={"name": "hello"})
            m = await api(
                "POST",
                "/v1/apps/hello/machines",
                json={"region": "mad", "config": hello_config(), "skip_launch": True},
            )
            mid, direct = m["id"], f"http://{m['private_ip']}:{PORT}/"
            app = {"souk-app": "hello"}
            machine = f"/v1/apps/hello/machines/{mid}"

            async def stopped() -> bool:
                row = replica.machine(mid)
                return row is not None and row.state in ("created", "stopped")

            for _ in range(runs):
                await until(stopped)
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
                await until(lambda: answers(http, direct))
                results["broker"].append(time.perf_counter() - t0)
                await api("POST", machine + "/stop", json={})
                await api("GET", machine + "/wait", params={"state": "stopped", "timeout": "20"})

                results["hand"].append(await by_hand(http))
            assert proxy.waker.starts == runs
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    results = asyncio.run(run(args.runs))
    p50 = {k: statistics.median(v) * 1000 for k, v in results.items()}
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


if __name__ == "__main__":
    main()
