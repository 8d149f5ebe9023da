"""Real servers on loopback, run the way souk runs them (`souk.web.runner`), and a raw HTTP
client that can send what no well-behaved client library would."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from souk.broker.fleet import StaticFleet
from souk.broker.placement.pipeline import Placer
from souk.broker.registry import AppRegistry
from souk.broker.server import make_app as make_broker_app
from souk.broker.state import Broker
from souk.broker.tokens import mint
from souk.clients.workers import WorkerClient
from souk.web import runner
from souk.worker.daemon import make_app as make_worker_app
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings
from tests.support.engines import destroy_all

SECRET = b"web-test-secret-0123456789"


@dataclass
class Reply:
    status: int
    headers: dict[str, str]
    body: Any

    @property
    def reason(self) -> Any:
        if not isinstance(self.body, dict):
            return None
        return self.body.get("code") or self.body.get("status")


async def raw(url: str, request: bytes) -> Reply:
    """Send bytes as they are; parse the one response (the server closes after an error)."""
    host, port = url.removeprefix("http://").split(":")
    reader, writer = await asyncio.open_connection(host, int(port))
    try:
        writer.write(request)
        await writer.drain()
        head = await reader.readuntil(b"\r\n\r\n")
        lines = head.decode("latin-1").split("\r\n")
        status = int(lines[0].split(" ")[1])
        headers = {}
        for line in lines[1:]:
            if ":" in line:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
        body = await reader.readexactly(int(headers.get("content-length", "0")))
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    text = body.decode()
    assert headers.get("content-type", "").startswith("application/json"), (status, text)
    return Reply(status, headers, json.loads(text) if text else None)


def request_bytes(
    method: str, path: str, body: bytes = b"", headers: dict[str, str] | None = None
) -> bytes:
    lines = [f"{method} {path} HTTP/1.1", "Host: test", f"Content-Length: {len(body)}"]
    if body:
        lines.append("Content-Type: application/json")
    lines += [f"{k}: {v}" for k, v in (headers or {}).items()]
    return ("\r\n".join(lines) + "\r\n\r\n").encode() + body


@contextlib.asynccontextmanager
async def serving(app: web.Application) -> AsyncIterator[str]:
    run = runner(app)
    await run.setup()
    try:
        site = web.TCPSite(run, "127.0.0.1", 0)
        await site.start()
        yield f"http://127.0.0.1:{run.addresses[0][1]}"
    finally:
        await run.cleanup()


@dataclass
class Servers:
    worker: str
    broker: str
    engine: Engine
    token: str  # every app, every action; not an operator


@pytest.fixture
async def servers(tmp_path: Path) -> AsyncIterator[Servers]:
    """One worker running real processes, and a broker in front of it."""
    settings = WorkerSettings(
        name="w1", region="mad", data_dir=tmp_path / "w1", cpus=4, memory_mb=4096, durable=False
    )
    async with contextlib.AsyncExitStack() as stack:
        engine = await stack.enter_async_context(
            running(Engine(settings, make_driver("process", settings)))
        )
        stack.push_async_callback(destroy_all, engine)  # machines outlive their worker
        worker = await stack.enter_async_context(serving(make_worker_app(engine)))
        client = WorkerClient()
        registry = AppRegistry(tmp_path / "registry.db")
        stack.callback(registry.close)
        fleet = StaticFleet([worker], registry, client)
        await fleet.refresh()
        placer = Placer(fleet, client, deadline=2.0)
        broker = Broker(
            fleet, client, placer, registry, before_place=lambda: fleet.refresh(machines=False)
        )
        registry.create("demo")
        url = await stack.enter_async_context(serving(make_broker_app(broker, SECRET)))
        yield Servers(worker, url, engine, mint(SECRET))
