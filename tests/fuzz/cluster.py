"""A small cluster to fuzz: sim-driver workers (they run nothing, so a fuzzer may create and
destroy machines freely) publishing to an in-process bus, and a broker placing from its replica,
all on loopback without TLS; then `st run` (schemathesis) against each /openapi.json."""

from __future__ import annotations

import asyncio
import contextlib
import re
import sys
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from aiohttp import web

from souk.broker.runtime import BrokerOptions, broker_site
from souk.broker.tokens import mint, new_secret
from souk.catalog.bus import InProcessBus
from souk.web import runner as web_runner
from souk.worker.daemon import make_app, make_driver, offering, publishing, running
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings

WORKERS = (("mad1", "mad"), ("ams1", "ams"))
# What a fuzz run insists on: no 5xx, and answers that match the document (status codes,
# content types, bodies), with `Allow` on every 405.
CHECKS = (
    "not_a_server_error",
    "status_code_conformance",
    "content_type_conformance",
    "response_schema_conformance",
    "unsupported_method",
    "allow_header_conformance",
)

# Left out: the catalog's change stream (it streams until the client leaves, so every case ends
# in a read timeout), and revoking a token (a fuzzer that finds its own token's id, as the links
# from GET /v1/tokens/current lead it to, locks itself out for the rest of the run).
EXCLUDED_PATHS = ("/v1/catalog/changes", "/v1/tokens/{id}")


@dataclass(frozen=True)
class FuzzCluster:
    broker: str
    token: str  # an operator token: every broker route is open to it
    workers: dict[str, str]  # name -> URL


@contextlib.asynccontextmanager
async def fuzz_cluster(data_dir: Path) -> AsyncIterator[FuzzCluster]:
    async with contextlib.AsyncExitStack() as stack:
        bus = InProcessBus()
        stack.push_async_callback(bus.close)
        workers: dict[str, str] = {}
        for name, region in WORKERS:
            settings = WorkerSettings(
                name=name,
                region=region,
                data_dir=data_dir / name,
                cpus=4,
                memory_mb=4096,
                durable=False,
            )
            engine = await stack.enter_async_context(
                running(Engine(settings, make_driver("sim", settings)))
            )
            runner = web_runner(make_app(engine))
            await runner.setup()
            stack.push_async_callback(runner.cleanup)
            await web.TCPSite(runner, "127.0.0.1", 0).start()
            url = workers[name] = f"http://127.0.0.1:{runner.addresses[0][1]}"
            await stack.enter_async_context(publishing(engine, bus, url))
            await stack.enter_async_context(offering(engine, bus))
        secret = new_secret()
        opts = BrokerOptions(
            "127.0.0.1", 0, secret, list(workers.values()), registry_dir=data_dir / "registry"
        )
        broker = await stack.enter_async_context(broker_site(opts, bus))
        yield FuzzCluster(broker, mint(secret, operator=True), workers)


@dataclass(frozen=True)
class Outcome:
    target: str
    exit_code: int
    output: str

    @property
    def ok(self) -> bool:
        return self.exit_code == 0

    def summary(self) -> str:
        """The last lines schemathesis prints: its own tally of operations and failures."""
        lines = [re.sub(r"\x1b\[[0-9;]*m", "", line) for line in self.output.splitlines()]
        tail = [line for line in lines if line.strip()][-12:]
        return "\n".join(tail)


async def schemathesis(
    target: str,
    base: str,
    token: str | None,
    max_examples: int,
    max_time: float | None = None,
    phases: Sequence[str] = (),
    report: Path | None = None,
) -> Outcome:
    """`st run` against `base`'s /openapi.json, in a subprocess (it speaks HTTP synchronously,
    while this process serves the cluster)."""
    argv = [sys.executable, "-m", "schemathesis.cli", "run", f"{base}/openapi.json"]
    argv += ["--checks", ",".join(CHECKS), "--max-examples", str(max_examples), "--no-color"]
    argv += ["--request-timeout", "30", "--seed", "1"]
    for path in EXCLUDED_PATHS:
        argv += ["--exclude-path", path]
    if max_time is not None:
        argv += ["--max-time", str(int(max_time))]
    if phases:
        argv += ["--phases", ",".join(phases)]
    if token is not None:
        argv += ["--header", f"Authorization: Bearer {token}"]
    if report is not None:
        argv += ["--report", "ndjson", "--report-dir", str(report / target)]
    proc = await asyncio.create_subprocess_exec(
        *argv, stdout=asyncio.subprocess.PIPE, stderr=asyncio.subprocess.STDOUT
    )
    out, _ = await proc.communicate()
    return Outcome(target, await proc.wait(), out.decode(errors="replace"))
