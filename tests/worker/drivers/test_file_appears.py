"""Waiting for a file (runc's pid file) on inotify: woken by its creation or its rename into
the directory, not by other files; given up when the process that should write it is done;
nothing left watched after."""

from __future__ import annotations

import asyncio
import os
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from souk.worker.drivers.file_appears import FileWatch


@pytest.fixture(params=["inotify", "polling"])
async def watch(request: pytest.FixtureRequest) -> AsyncIterator[FileWatch]:
    found = FileWatch()
    if request.param == "polling":  # a host without inotify to give
        found._opened = lambda: None  # type: ignore[method-assign]
    yield found
    found.close()


async def later(seconds: float, *steps: object) -> None:
    await asyncio.sleep(seconds)
    for step in steps:
        assert callable(step)
        step()


async def test_a_file_renamed_in_is_seen_and_its_neighbours_are_not_taken_for_it(
    watch: FileWatch, tmp_path: Path
) -> None:
    pid = tmp_path / "container.pid"
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    writes = asyncio.ensure_future(
        later(
            0.05,
            (tmp_path / "other").touch,  # wakes the wait, which looks and waits on
            (tmp_path / ".pid.tmp").touch,
            lambda: os.rename(tmp_path / ".pid.tmp", pid),
        )
    )
    assert await asyncio.wait_for(watch.appears(pid, never), 5)
    assert pid.exists() and writes.done()
    assert watch._waiting == {}  # its watch removed


async def test_two_waits_in_one_directory_each_see_their_file(
    watch: FileWatch, tmp_path: Path
) -> None:
    never: asyncio.Future[None] = asyncio.get_running_loop().create_future()
    first, second = tmp_path / "a", tmp_path / "b"
    waits = [asyncio.ensure_future(watch.appears(p, never)) for p in (first, second)]
    await later(0.05, first.touch)
    assert await asyncio.wait_for(waits[0], 5)
    assert not waits[1].done()
    await later(0.01, second.touch)
    assert await asyncio.wait_for(waits[1], 5)
    assert watch._waiting == {}


async def test_a_wait_ends_when_what_should_write_the_file_ends_first(
    watch: FileWatch, tmp_path: Path
) -> None:
    exited: asyncio.Future[int] = asyncio.get_running_loop().create_future()
    asyncio.get_running_loop().call_later(0.05, exited.set_result, 1)
    assert not await asyncio.wait_for(watch.appears(tmp_path / "never", exited), 5)
    assert watch._waiting == {}
    (tmp_path / "ready").touch()  # there already: no wait at all, whatever `unless` says
    assert await watch.appears(tmp_path / "ready", exited)
