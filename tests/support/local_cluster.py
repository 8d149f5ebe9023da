"""A real local cluster for the proxy: process-driver workers publishing to an in-process bus, a
broker placing from its catalog replica, and a proxy over a replica of its own. Machines are
real processes running the example app (`examples/hello/app.py`)."""

from __future__ import annotations

import asyncio
import contextlib
import os
import signal
import time
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from aiohttp import web

from souk.broker.runtime import BrokerSettings, broker_site
from souk.broker.tokens import mint
from souk.catalog.bus import InProcessBus
from souk.catalog.owner import Owner
from souk.catalog.replica import Replica
from souk.proxy.server import Proxy, ProxySettings, proxy_site
from souk.proxy.wake import port_open
from souk.web import runner as web_runner
from souk.worker.daemon import make_app, make_driver, offering, running
from souk.worker.engine import Engine
from souk.worker.rows import WorkerRows
from souk.worker.settings import WorkerSettings
from tests.support.hello import PORT
from tests.support.machines import remove_groups
from tests.support.waiting import eventually

SECRET = b"proxy-test-secret-0123456789"
BEAT = 0.2


@dataclass
class Worker:
    name: str
    region: str
    engine: Engine
    stack: contextlib.AsyncExitStack
    url: str
    alive: bool = True

    def pids(self) -> list[int]:
        rows = self.engine.store.read.execute("SELECT pid FROM machines WHERE pid IS NOT NULL")
        return [int(r[0]) for r in rows.fetchall()]

    async def kill(self) -> None:
        """The host dies: no more heartbeats, no API, its machines' processes gone (and, as a
        host's would be, their cgroups)."""
        if not self.alive:
            return
        self.alive = False
        pids = self.pids()
        ids = {r[0] for r in self.engine.store.read.execute("SELECT id FROM machines")}
        await self.stack.aclose()
        for pid in pids:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(pid, signal.SIGKILL)
        await asyncio.to_thread(remove_groups, ids)


@dataclass
class LocalCluster:
    broker_url: str
    token: str
    workers: dict[str, Worker]
    replica: Replica
    proxy: Proxy
    proxy_url: str
    http: aiohttp.ClientSession
    created: list[str] = field(default_factory=list)

    def auth(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self.token}"}

    async def api(self, method: str, path: str, status: int = 200, **kw: Any) -> Any:
        async with self.http.request(
            method, self.broker_url + path, headers=self.auth(), **kw
        ) as resp:
            text = await resp.text()
            assert resp.status == status, f"{method} {path}: {resp.status} {text}"
            return await resp.json() if text else None

    async def create(self, app: str, region: str, config: dict[str, Any], **kw: Any) -> Any:
        body = {"region": region, "config": config, **kw}
        machine = await self.api("POST", f"/v1/apps/{app}/machines", json=body)
        self.created.append(machine["id"])
        return machine

    async def state(self, app: str, mid: str) -> str:
        machine = await self.api("GET", f"/v1/apps/{app}/machines/{mid}")
        return str(machine["state"])

    async def wait(self, app: str, mid: str, state: str) -> None:
        await self.api(
            "GET", f"/v1/apps/{app}/machines/{mid}/wait", params={"state": state, "timeout": "20"}
        )

    async def serving(self, app: str, machine: dict[str, Any]) -> None:
        """Started, shown started by the proxy's replica, and its app accepting connections."""
        await self.wait(app, machine["id"], "started")
        await eventually(lambda: self.seen(machine["id"], "started"))
        assert await port_open(machine["private_ip"], PORT, time.monotonic() + 10)

    def seen(self, mid: str, state: str) -> bool:
        """Whether the proxy's replica shows the machine in this state."""
        row = self.replica.machine(mid)
        return row is not None and row.state == state

    async def get(self, app: str, path: str = "/") -> tuple[int, dict[str, str], Any]:
        async with self.http.get(self.proxy_url + path, headers={"souk-app": app}) as resp:
            body = await resp.json(content_type=None)
            return resp.status, dict(resp.headers), body


async def _worker(
    tmp: Path, bus: InProcessBus, name: str, region: str
) -> tuple[Worker, contextlib.AsyncExitStack]:
    stack = contextlib.AsyncExitStack()
    settings = WorkerSettings(
        name=name,
        region=region,
        data_dir=tmp / name,
        cpus=4,
        memory_mb=4096,
        durable=False,
    )
    engine = await stack.enter_async_context(
        running(Engine(settings, make_driver("process", settings)))
    )
    runner = web_runner(make_app(engine))
    await runner.setup()
    stack.push_async_callback(runner.cleanup)
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    url = f"http://127.0.0.1:{runner.addresses[0][1]}"
    rows = WorkerRows(engine, url)
    owner = Owner(bus, rows, heartbeat_every=BEAT)
    rows.attach(owner)
    await owner.start()
    stack.push_async_callback(owner.stop)
    stack.callback(rows.detach)
    await stack.enter_async_context(offering(engine, bus))  # brokers ask for offers on the bus
    return Worker(name, region, engine, stack, url), stack


@contextlib.asynccontextmanager
async def local_cluster(
    tmp: Path,
    workers: list[tuple[str, str]],
    apps: list[str],
    region: str | None = "mad",
    idle_timeout: float = 60.0,
    start_timeout: float = 10.0,
) -> AsyncIterator[LocalCluster]:
    async with contextlib.AsyncExitStack() as stack:
        bus = InProcessBus()
        stack.push_async_callback(bus.close)
        found: dict[str, Worker] = {}

        async def kill_all() -> None:
            for w in found.values():
                await w.kill()

        stack.push_async_callback(kill_all)  # runs after the proxy and broker are gone
        for name, reg in workers:
            found[name], _ = await _worker(tmp, bus, name, reg)
        opts = BrokerSettings(
            host="127.0.0.1",
            port=0,
            secret=SECRET,
            workers=[w.url for w in found.values()],
            registry_dir=tmp / "registry",
        )
        broker_url = await stack.enter_async_context(broker_site(opts, bus))
        token = mint(SECRET, operator=True)
        replica = Replica(bus, unreachable_after=4 * BEAT + 0.2)
        await replica.start(bootstrap=False)
        stack.push_async_callback(replica.stop)
        popts = ProxySettings(
            port=0,
            api=broker_url,
            token=token,
            region=region,
            idle_timeout=idle_timeout,
            start_timeout=start_timeout,
        )
        proxy, proxy_url = await stack.enter_async_context(proxy_site(replica, popts))
        http = await stack.enter_async_context(aiohttp.ClientSession())
        c = LocalCluster(broker_url, token, found, replica, proxy, proxy_url, http)
        for app in apps:
            await c.api("POST", "/v1/apps", status=201, json={"name": app})
        await eventually(lambda: len(replica.workers()) == len(workers))
        yield c
