"""A small cluster to fuzz: sim-driver workers (they run nothing, so a fuzzer may create and
destroy machines freely) publishing to an in-process bus, and a broker placing from its replica,
all on loopback without TLS; then `st run` (schemathesis) against each /openapi.json."""

from __future__ import annotations

import asyncio
import contextlib
import json
import re
import sys
import time
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from pathlib import Path

import aiohttp
from aiohttp import web

from souk.broker.runtime import BrokerSettings, broker_site
from souk.broker.tokens import mint
from souk.catalog.bus import InProcessBus
from souk.node.cluster_secret import new_secret
from souk.web import runner as web_runner
from souk.worker.daemon import make_app, make_driver, offering, publishing, running
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings

WORKERS = (("mad1", "mad"), ("ams1", "ams"))
APP = "fuzz"
MACHINE = {"region": "mad", "config": {"init": {"exec": ["sleep", "60"]}}}
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

# Left out everywhere: waiting for a state, which blocks up to a minute by design (every case
# that leaves out `timeout` would wait it out). On the broker: the catalog's change stream and the
# dashboard's (they stream until the client leaves, so every case ends in a read timeout), and
# revoking a token (a fuzzer that finds its own token's id, as the links from
# GET /v1/tokens/current lead it to, locks itself out for the rest of the run).
EXCLUDED_REGEX = r"/wait$"
BROKER_EXCLUDED = ("/v1/catalog/changes", "/ui/events", "/v1/tokens/{id}")


@dataclass(frozen=True)
class FuzzCluster:
    broker: str
    token: str  # an operator token: every broker route is open to it
    workers: dict[str, str]  # name -> URL
    app: str  # an app that exists, with...
    machine: str  # ...a machine (on the first worker), for the paths that name them


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
        opts = BrokerSettings(
            host="127.0.0.1",
            port=0,
            secret=secret,
            workers=list(workers.values()),
            registry_dir=data_dir / "registry",
        )
        broker = await stack.enter_async_context(broker_site(opts, bus))
        token = mint(secret, operator=True)
        machine = await _seed(broker, token)
        yield FuzzCluster(broker, token, workers, APP, machine)


async def _seed(broker: str, token: str) -> str:
    """An app and a machine of it, so that fuzzing reaches past "no such app/machine"; the
    machine is placed once the broker's replica lists the workers."""
    headers = {"Authorization": f"Bearer {token}"}
    async with aiohttp.ClientSession(broker, headers=headers) as http:
        async with http.post("/v1/apps", json={"name": APP}) as resp:
            assert resp.status == 201, await resp.text()
        deadline = time.monotonic() + 20
        while True:
            async with http.post(f"/v1/apps/{APP}/machines", json=MACHINE) as resp:
                if resp.status == 200:
                    return str((await resp.json())["id"])
                if time.monotonic() > deadline:
                    raise RuntimeError(f"could not place a machine: {await resp.text()}")
            await asyncio.sleep(0.1)


def config(path: Path, app: str, machine: str) -> Path:
    """A schemathesis config: path parameters named `app` and `id` take the seeded app and
    machine most of the time, generated values otherwise."""
    lines = [
        "[dictionaries.apps]",
        f"values = [{json.dumps(app)}]",
        "[dictionaries.machines]",
        f"values = [{json.dumps(machine)}]",
        "[parameters]",
        '"path.app" = { dictionary = "apps", probability = 0.8 }',
        '"path.id" = { dictionary = "machines", probability = 0.8 }',
    ]
    path.write_text("\n".join(lines) + "\n")
    return path


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
    config_file: Path | None = None,
    excluded: Sequence[str] = (),
    seed: int | None = None,
) -> Outcome:
    """`st run` against `base`'s /openapi.json, in a subprocess (it speaks HTTP synchronously,
    while this process serves the cluster). Without a seed, each run explores anew; the seed it
    picked is in its output, to replay a finding."""
    argv = [sys.executable, "-m", "schemathesis.cli"]
    if config_file is not None:
        argv += ["--config-file", str(config_file)]
    argv += ["run", f"{base}/openapi.json"]
    argv += ["--checks", ",".join(CHECKS), "--max-examples", str(max_examples), "--no-color"]
    argv += ["--request-timeout", "30"]
    if seed is not None:
        argv += ["--seed", str(seed)]
    argv += ["--exclude-path-regex", EXCLUDED_REGEX]
    for path in excluded:
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
