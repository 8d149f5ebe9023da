"""`souk dev`: a whole cluster in one process on loopback, the way a user first meets souk.

Every part is the real one, wired as in a multi-host deployment, except that the bus is the
in-process one instead of NATS: six workers (three regions of two) publishing to the catalog and
answering offers, a broker hosting the app registry, and a proxy with its own replica.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from souk.broker.runtime import BrokerOptions, broker_site, until_signalled
from souk.broker.tokens import mint, new_secret, read_secret
from souk.catalog.bus import InProcessBus
from souk.catalog.replica import following
from souk.models.machine import MachineState
from souk.proxy.server import ProxyOptions, proxy_site
from souk.secret_files import write_secret
from souk.web import runner as web_runner
from souk.worker.daemon import make_app as make_worker_app
from souk.worker.daemon import make_driver, offering, publishing, running
from souk.worker.engine import Engine
from souk.worker.errors import WorkerError
from souk.worker.settings import WorkerSettings

REGIONS = ("mad", "ams", "sin")
STOP_GRACE = 10.0  # past a machine's own stop timeout, before it is reported left running
log = logging.getLogger("souk.dev")


@dataclass(frozen=True)
class DevCluster:
    api: str  # the broker's URL
    token: str  # an operator token
    proxy: str  # the proxy's URL
    domain: str


def _secret(data_dir: Path) -> bytes:
    path = data_dir / "secret"
    with contextlib.suppress(FileExistsError):  # kept across runs: its tokens stay valid
        write_secret(path, new_secret() + b"\n", replace=False)
    return read_secret(path)


@contextlib.asynccontextmanager
async def dev_cluster(
    data_dir: Path,
    host: str = "127.0.0.1",
    port: int = 4280,
    proxy_port: int = 4300,
    driver: str = "process",
    cpus: int = 4,
    memory_mb: int = 4096,
    idle_timeout: float = 60.0,
) -> AsyncIterator[DevCluster]:
    data_dir.mkdir(parents=True, exist_ok=True)
    secret = _secret(data_dir)
    async with contextlib.AsyncExitStack() as stack:
        bus = InProcessBus()
        stack.push_async_callback(bus.close)
        urls = []
        engines: list[Engine] = []
        for region in REGIONS:
            for n in (1, 2):
                name = f"{region}{n}"
                settings = WorkerSettings(
                    name=name,
                    region=region,
                    data_dir=data_dir / "workers" / name,
                    cpus=cpus,
                    memory_mb=memory_mb,
                    durable=False,
                )
                engine = await stack.enter_async_context(
                    running(Engine(settings, make_driver(driver, settings)))
                )
                engines.append(engine)
                runner = web_runner(make_worker_app(engine))
                await runner.setup()
                stack.push_async_callback(runner.cleanup)
                await web.TCPSite(runner, host, 0).start()
                urls.append(f"http://{host}:{runner.addresses[0][1]}")
                await stack.enter_async_context(publishing(engine, bus, urls[-1]))
                await stack.enter_async_context(offering(engine, bus))
        # after the broker and proxy have closed (nothing starts machines any more), before the
        # workers do
        stack.push_async_callback(stop_machines, engines)
        opts = BrokerOptions(host, port, secret, urls, registry_dir=data_dir / "registry")
        api = await stack.enter_async_context(broker_site(opts, bus))
        token = mint(secret, operator=True)
        replica = await stack.enter_async_context(following(bus, bootstrap=False))
        proxy_opts = ProxyOptions(
            host=host, port=proxy_port, api=api, token=token, idle_timeout=idle_timeout
        )
        _, proxy = await stack.enter_async_context(proxy_site(replica, proxy_opts))
        write_secret(data_dir / "token", token + "\n")  # an operator token: 0600
        (data_dir / "api").write_text(api + "\n")
        yield DevCluster(api, token, proxy, proxy_opts.domain)


async def stop_machines(engines: list[Engine]) -> int:
    """Stop every machine that runs (or is on its way to) and wait until it has; returns how
    many were asked to stop. Machines being destroyed are waited for too."""

    async def settle(engine: Engine, machine_id: str) -> None:
        target: MachineState = "stopped"
        try:
            machine = await engine.submit(machine_id, "stop")  # queued, or already on its way
        except WorkerError:  # nothing to stop, or being destroyed
            machine = engine.get(machine_id, events=False)
            if machine.state != "destroying":
                return
            target = "destroyed"
        timeout = float(machine.config.stop_config.timeout) + STOP_GRACE
        ok, found = await engine.wait(machine_id, target, timeout, None)
        if not ok:
            log.warning("machine %s is still %s; it may be left running", machine_id, found.state)

    live = [
        (engine, m.id)
        for engine in engines
        for m in engine.machines()
        if m.state in ("created", "starting", "started", "stopping", "destroying")
    ]
    if live:
        print(f"souk dev: stopping {len(live)} machines", flush=True)
        await asyncio.gather(*(settle(engine, mid) for engine, mid in live))
    return len(live)


async def run_dev(data_dir: Path, host: str, port: int, proxy_port: int, driver: str) -> None:
    async with dev_cluster(data_dir, host, port, proxy_port, driver) as dev:
        print(f"souk dev: 3 regions ({', '.join(REGIONS)}) x 2 workers")
        print(f"  broker (Machines API): {dev.api}")
        print(f"  proxy: {dev.proxy}  (apps at <app>.{dev.domain}, or header 'souk-app: <app>')")
        print(f"export SOUK_API={dev.api}")
        print(f"export SOUK_TOKEN={dev.token}")
        print("then, in examples/hello: souk deploy", flush=True)
        await until_signalled()
