"""What the proxy's check that a new connection reaches its machine's own socket costs, next to
the connection itself, in one run: a TCP connect to a started machine (what any new upstream
connection pays), the check as it runs for a listener already confirmed (a sock_diag dump of
listeners and a set lookup), the check for a listener not seen yet (one question to the
machine's worker), and what reading /proc/net/tcp (the way the check did not take) would have
cost on this host, with how many sockets it lists. Pooled connections pay nothing.

Everything runs on loopback in this process (a process-driver worker, a broker, replicas on an
in-process bus, the proxy); the machine runs `examples/hello/app.py`.
Run: python bench/socket_check.py [--rounds N]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

from rich.console import Console
from rich.table import Table

import _harness  # noqa: F401  (puts the repository root on the path, for tests.support)

from souk.proxy.holders import Holders
from souk.proxy.routing import backend_of
from tests.support.hello import hello_config
from tests.support.local_cluster import local_cluster


async def median_us(rounds: int, step: Callable[[], Awaitable[object]]) -> float:
    times = []
    for _ in range(rounds):
        t0 = time.perf_counter()
        await step()
        times.append(time.perf_counter() - t0)
    return statistics.median(times) * 1e6


async def run(rounds: int) -> list[tuple[str, float]]:
    with tempfile.TemporaryDirectory() as tmpdir:
        async with local_cluster(Path(tmpdir), [("mad1", "mad")], ["hello"]) as c:
            machine = await c.create("hello", "mad", hello_config(autostop=False))
            await c.serving("hello", machine)
            row = c.replica.machine(machine["id"])
            assert row is not None
            backend = backend_of(row)
            assert backend is not None
            holders = c.proxy.holders
            assert isinstance(holders, Holders)

            async def connect() -> None:
                _, writer = await asyncio.open_connection(backend.host, backend.port)
                writer.close()
                await writer.wait_closed()

            async def unseen() -> None:
                holders._held.clear()  # as for a listener never confirmed
                await holders.check(backend)

            async def proc_net_tcp() -> int:
                text = (
                    Path("/proc/self/net/tcp").read_text() + Path("/proc/self/net/tcp6").read_text()
                )
                return text.count("\n")

            await holders.check(backend)
            sockets = await proc_net_tcp()
            return [
                ("TCP connect to the machine", await median_us(rounds, connect)),
                (
                    "check, listener confirmed before",
                    await median_us(rounds, lambda: holders.check(backend)),
                ),
                ("check, listener not seen yet (asks the worker)", await median_us(rounds, unseen)),
                (
                    f"reading /proc/net/tcp{{,6}} ({sockets} lines)",
                    await median_us(rounds, proc_net_tcp),
                ),
            ]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=200)
    args = parser.parse_args()
    results = asyncio.run(run(args.rounds))
    base = results[0][1]
    table = Table(title=f"per new connection, median of {args.rounds}")
    table.add_column("step")
    table.add_column("µs", justify="right")
    table.add_column("x connect", justify="right")
    for name, us in results:
        table.add_row(name, f"{us:.0f}", f"{us / base:.2f}")
    Console().print(table)


if __name__ == "__main__":
    main()
