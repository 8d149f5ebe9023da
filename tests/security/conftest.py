"""A cluster CA and the TLS parts of a cluster in one process: sim-driver workers serving
mutual TLS on loopback, and servers that hold a valid certificate but are not who a row says."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from souk.catalog.bus import Bus
from souk.catalog.node import NodeKey
from souk.pki import NodeFiles, server_context
from souk.web import runner as web_runner
from souk.worker.daemon import make_app, make_driver, offering, publishing, running, tls_context
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings
from tests.support.pki import LOOPBACK, Pki, new_pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return new_pki(tmp_path)


@pytest.fixture
def other_pki(tmp_path: Path) -> Pki:
    return new_pki(tmp_path, "other-ca")


@contextlib.asynccontextmanager
async def listening(app: web.Application, ctx: ssl.SSLContext | None) -> AsyncIterator[str]:
    """`app` on a loopback port behind `ctx` (plain HTTP if None); yields its base URL."""
    runner = web_runner(app)
    await runner.setup()
    try:
        await web.TCPSite(runner, LOOPBACK, 0, ssl_context=ctx).start()
        scheme = "http" if ctx is None else "https"
        yield f"{scheme}://{LOOPBACK}:{runner.addresses[0][1]}"
    finally:
        await runner.cleanup()


@dataclass
class TlsWorker:
    name: str
    engine: Engine
    app: web.Application
    url: str
    files: NodeFiles


@contextlib.asynccontextmanager
async def tls_worker(
    tmp: Path,
    pki: Pki,
    name: str,
    region: str = "mad",
    bus: Bus | None = None,
    cpus: int = 4,
    advertise: str | None = None,
) -> AsyncIterator[TlsWorker]:
    """A sim worker serving mutual TLS with a certificate for `name`; with a bus, it publishes
    its rows signed with its key (saying it is at `advertise`, if given) and answers offers."""
    settings = WorkerSettings(
        name=name, region=region, data_dir=tmp / name, cpus=cpus, memory_mb=4096, durable=False
    )
    files = pki.node("worker", name)
    async with contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(
            running(Engine(settings, make_driver("sim", settings)))
        )
        app = make_app(engine, secure=True)
        url = await stack.enter_async_context(listening(app, tls_context(files)))
        if bus is not None:
            signer = NodeKey(files)
            await stack.enter_async_context(publishing(engine, bus, advertise or url, signer))
            await stack.enter_async_context(offering(engine, bus))
        yield TlsWorker(name, engine, app, url, files)


@dataclass
class Impostor:
    """A TLS server with a valid certificate of its own name, answering every request with 201
    and a made-up body, and recording what reached it."""

    url: str
    files: NodeFiles
    seen: list[str] = field(default_factory=list)


@contextlib.asynccontextmanager
async def impostor(pki: Pki, name: str = "evil", tls: bool = True) -> AsyncIterator[Impostor]:
    files = pki.node("worker", name)
    found = Impostor("", files)

    async def record(request: web.Request) -> web.Response:
        found.seen.append(f"{request.method} {request.path} {await request.text()}")
        return web.json_response({"taken": True}, status=201)

    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", record)
    ctx = server_context(files, require_client_cert=False) if tls else None
    async with listening(app, ctx) as url:
        found.url = url
        yield found
