"""What every running part shares (`souk.node`): the stop signal, repeated tasks, the cluster
secret's file, the served listener."""

from __future__ import annotations

import asyncio
import logging
import os
import signal
import stat
from pathlib import Path

import aiohttp
import pytest
from aiohttp import web

from souk.node.cluster_secret import MIN_SECRET_BYTES, create_secret, kept_secret, read_secret
from souk.node.periodic import every
from souk.node.signals import until_signalled
from souk.node.site import served


async def test_a_failing_tick_is_logged_and_the_next_one_still_comes(
    caplog: pytest.LogCaptureFixture,
) -> None:
    ticks: list[int] = []

    async def tick() -> None:
        ticks.append(len(ticks))
        if len(ticks) == 1:
            raise RuntimeError("first tick breaks")

    log = logging.getLogger("souk.test.periodic")
    task = asyncio.create_task(every(0.01, tick, what="the test tick", log=log))
    while len(ticks) < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task
    assert [r.getMessage() for r in caplog.records if r.name == log.name] == [
        "the test tick failed"
    ]


async def test_an_interval_read_before_each_wait() -> None:
    seen: list[float] = []
    intervals = iter([0.01, 0.02, 0.03])

    def interval() -> float:
        seen.append(next(intervals, 0.01))
        return seen[-1]

    async def tick() -> None:
        pass

    log = logging.getLogger("souk.test.periodic")
    task = asyncio.create_task(every(interval, tick, what="t", log=log))
    while len(seen) < 3:
        await asyncio.sleep(0.01)
    task.cancel()
    assert seen[:3] == [0.01, 0.02, 0.03]


async def test_until_signalled_returns_at_sigterm() -> None:
    waiting = asyncio.create_task(until_signalled())
    await asyncio.sleep(0)  # its handlers are in place
    assert not waiting.done()
    os.kill(os.getpid(), signal.SIGTERM)
    await asyncio.wait_for(waiting, 5)
    loop = asyncio.get_running_loop()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.remove_signal_handler(sig)


def test_the_cluster_secret_is_made_once_0600_and_kept(tmp_path: Path) -> None:
    path = tmp_path / "secret"
    first = kept_secret(path)
    assert stat.S_IMODE(path.stat().st_mode) == 0o600 and len(first) >= MIN_SECRET_BYTES
    assert kept_secret(path) == first == read_secret(path)  # its tokens stay valid
    with pytest.raises(FileExistsError):
        create_secret(path)
    create_secret(path, replace=True)
    assert read_secret(path) != first
    (tmp_path / "short").write_bytes(b"too short\n")
    with pytest.raises(ValueError, match="at least"):
        read_secret(tmp_path / "short")


async def test_served_yields_the_port_it_got_and_stops_listening_after() -> None:
    app = web.Application()

    async def hello(_: web.Request) -> web.Response:
        return web.json_response({"ok": True})

    app.router.add_get("/", hello)
    async with served(app, "127.0.0.1", 0) as url:
        assert url.startswith("http://127.0.0.1:") and not url.endswith(":0")
        async with aiohttp.ClientSession() as http, http.get(url) as resp:
            assert resp.status == 200 and await resp.json() == {"ok": True}
    with pytest.raises(aiohttp.ClientConnectionError):
        async with aiohttp.ClientSession() as http, http.get(url):
            pass
