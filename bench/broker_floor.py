"""The floor under a broker's CPU per create: what its two HTTP exchanges cost through aiohttp
when nothing else happens in them.

A create is, for the broker, one request served (the public API) and one request sent (the
reservation to the chosen worker), plus a share of a confirmation call. This measures each side
alone, in CPU time of this process only, the other side being a child process:

- served: an aiohttp server whose handler reads a create's body and answers a machine's JSON,
  nothing between (no validation, no middleware); the load comes from a child process;
- sent: an aiohttp client session posting a create's body and reading a machine's answer from a
  child process's server.

Both at `--concurrency` in flight over kept-alive connections, as the broker runs, the phases
alternating `--rounds` times. Next to the broker's CPU per create from `bench/placement.py`, the
difference is what souk itself does per create (validation, the decision, the catalog replica,
the confirmation) and what the event loop spends between them.

`--tls`: both exchanges over mutual TLS with the contexts souk's parts use (`souk.pki`: TLS 1.3, a
cluster CA's certificates on both sides), as in a secured cluster; each
round then measures them plain too, and the ratio is what TLS costs the floor. `--loop`: the
event loop this process (the measured side) runs on: asyncio's or uvloop's.

    .venv/bin/python bench/broker_floor.py            # about half a minute
    .venv/bin/python bench/broker_floor.py --tls --loop uvloop
"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import aiohttp
import uvloop
from aiohttp import web
from rich.console import Console
from rich.table import Table

from _harness import Pki, machine_info

from souk.models.machine import Machine, MachineConfig
from souk.pki import NodeFiles, client_context, server_context

CREATE = json.dumps(
    {
        "region": "bench",
        "config": {"init": {"exec": ["true"]}, "guest": {"cpus": 1, "memory_mb": 256}},
    }
).encode()
STAMP = "2026-11-27T00:00:00Z"
MACHINE = (
    Machine(
        id="0123456789abcd",
        name="bench-machine",
        app="bench",
        region="bench",
        state="started",
        instance_id="01JBENCH00000000000000000",
        config=MachineConfig.model_validate(json.loads(CREATE)["config"]),
        worker="bench-worker-0001",
        private_ip="fdaa::2",
        created_at=STAMP,
        updated_at=STAMP,
    )
    .model_dump_json(exclude_none=True)
    .encode()
)


Tls = NodeFiles | None  # one node's certificate, key and CA, shown by both sides; None: plain


def client_session(tls: Tls) -> aiohttp.ClientSession:
    context = client_context(tls) if tls else True
    return aiohttp.ClientSession(connector=aiohttp.TCPConnector(ssl=context))


def scheme(tls: Tls) -> str:
    return "https" if tls else "http"


async def serve(tls: Tls = None) -> tuple[web.AppRunner, int]:
    async def create(request: web.Request) -> web.Response:
        await request.read()
        return web.Response(body=MACHINE, content_type="application/json")

    app = web.Application()
    app.router.add_post("/v1/machines", create)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    context = server_context(tls) if tls else None
    site = web.TCPSite(runner, "127.0.0.1", 0, backlog=1024, ssl_context=context)
    await site.start()
    return runner, runner.addresses[0][1]


async def send(http: aiohttp.ClientSession, url: str, requests: int, concurrency: int) -> None:
    """`requests` posts, `concurrency` at a time, over the session's kept-alive connections."""
    left = requests
    headers = {"Content-Type": "application/json"}

    async def one_at_a_time() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            async with http.post(url, data=CREATE, headers=headers) as resp:
                await resp.read()
                assert resp.status == 200

    await asyncio.gather(*(one_at_a_time() for _ in range(concurrency)))


async def child(role: str, arg: str, requests: int, concurrency: int, tls: Tls) -> None:
    """The other side, in its own process (on asyncio's loop): a server that says its port, or
    a load that posts once told to go (its warm-up already done)."""
    if role == "serve":
        runner, port = await serve(tls)
        print(port, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await runner.cleanup()
        return
    async with client_session(tls) as http:
        await send(http, arg, concurrency * 4, concurrency)  # the connections, then held
        print("warm", flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        await send(http, arg, requests, concurrency)
    print("done", flush=True)


async def spawn(tls: Tls, *args: str) -> asyncio.subprocess.Process:
    files = [str(tls.cert), str(tls.key), str(tls.ca)] if tls else []
    return await asyncio.create_subprocess_exec(
        sys.executable, __file__, "--child", *args, *files, stdin=-1, stdout=-1
    )


async def served(requests: int, concurrency: int, tls: Tls = None) -> float:
    """µs of this process's CPU per request served."""
    runner, port = await serve(tls)
    url = f"{scheme(tls)}://127.0.0.1:{port}/v1/machines"
    load = await spawn(tls, "load", url, str(requests), str(concurrency))
    assert load.stdout is not None and load.stdin is not None
    await load.stdout.readline()  # warm
    began = time.process_time()
    load.stdin.write(b"go\n")
    await load.stdin.drain()
    await load.stdout.readline()  # done
    used = time.process_time() - began
    await load.wait()
    await runner.cleanup()
    return used / requests * 1e6


async def sent(requests: int, concurrency: int, tls: Tls = None) -> float:
    """µs of this process's CPU per request sent."""
    server = await spawn(tls, "serve", "", "0", "0")
    assert server.stdout is not None and server.stdin is not None
    url = f"{scheme(tls)}://127.0.0.1:{int(await server.stdout.readline())}/v1/machines"
    async with client_session(tls) as http:
        await send(http, url, concurrency * 4, concurrency)
        began = time.process_time()
        await send(http, url, requests, concurrency)
        used = time.process_time() - began
    server.stdin.write(b"stop\n")
    await server.stdin.drain()
    await server.wait()
    return used / requests * 1e6


async def measure(rounds: int, requests: int, concurrency: int, tls: Tls) -> dict[str, Any]:
    """Each side per round, plain; with `tls`, over TLS too, right after it (the order of
    the sides, and of plain and TLS, alternating from round to round)."""
    kinds: list[Tls] = [None, tls] if tls else [None]
    runs: dict[str, list[float]] = {}
    for i in range(rounds):
        order = ("served", "sent") if i % 2 == 0 else ("sent", "served")
        for side in order:
            phase = served if side == "served" else sent
            for kind in kinds if i % 2 == 0 else kinds[::-1]:
                name = side + (" over TLS" if kind else "")
                runs.setdefault(name, []).append(await phase(requests, concurrency, kind))
    return {
        "rounds": rounds,
        "requests": requests,
        "concurrency": concurrency,
        "create_bytes": len(CREATE),
        "machine_bytes": len(MACHINE),
        "us": runs,
        "median_us": {name: statistics.median(values) for name, values in runs.items()},
    }


def main() -> None:
    if sys.argv[1:2] == ["--child"]:
        role, arg, requests, concurrency, *paths = sys.argv[2:]
        given: Tls = NodeFiles(*map(Path, paths)) if paths else None
        asyncio.run(child(role, arg, int(requests), int(concurrency), given))
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--requests", type=int, default=5000, help="per phase")
    parser.add_argument("--concurrency", type=int, default=32)
    parser.add_argument("--tls", action="store_true", help="each side over TLS too")
    parser.add_argument("--loop", choices=("asyncio", "uvloop"), default="asyncio")
    parser.add_argument("--json", action="store_true", help="print the report as JSON")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="souk-bench-") as tmp:
        tls = Pki(Path(tmp)).files("worker", "floor", sans=["127.0.0.1"]) if args.tls else None
        run = uvloop.run if args.loop == "uvloop" else asyncio.run
        report = run(measure(args.rounds, args.requests, args.concurrency, tls))
    report["loop"] = args.loop
    if args.json:
        print(json.dumps(report, indent=2))
        return
    title = f"aiohttp's floor per create on {args.loop}, µs of CPU ({machine_info()})"
    table = Table(title=title)
    for col in ("side", *(f"round {i}" for i in range(args.rounds)), "median"):
        table.add_column(col, justify="left" if col == "side" else "right")
    for name, values in report["us"].items():
        table.add_row(name, *(f"{v:.0f}" for v in values), f"{statistics.median(values):.0f}")
    Console().print(table)


if __name__ == "__main__":
    main()
