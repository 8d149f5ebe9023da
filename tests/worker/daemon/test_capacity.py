"""Concurrent creates against a real worker never overcommit it."""

from __future__ import annotations

import asyncio
from collections import Counter
from typing import Any

import aiohttp
import pytest

from tests.support.worker_process import WorkerFactory

pytestmark = pytest.mark.integration

ROOM = 50
ASKED = 200


async def test_200_concurrent_creates_fill_room_for_50_exactly(
    spawn_worker: WorkerFactory,
) -> None:
    worker = spawn_worker(cpus=ROOM, memory_mb=ROOM * 1024)  # cpus run out first
    body = {
        "app": "demo",
        "start": False,
        "config": {"init": {"exec": ["true"]}, "guest": {"cpus": 1, "memory_mb": 256}},
    }
    go = asyncio.Event()

    async def create(session: aiohttp.ClientSession) -> tuple[int, Any]:
        await go.wait()
        async with session.post(f"{worker.url}/v1/machines", json=body) as resp:
            return resp.status, await resp.json()

    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        tasks = [asyncio.create_task(create(session)) for _ in range(ASKED)]
        await asyncio.sleep(0.05)
        go.set()
        results = await asyncio.gather(*tasks)

    statuses = Counter(status for status, _ in results)
    assert statuses == {201: ROOM, 412: ASKED - ROOM}
    refused = [answer for status, answer in results if status == 412]
    assert {answer["code"] for answer in refused} == {"insufficient_capacity"}
    created = {answer["id"] for status, answer in results if status == 201}
    assert len(created) == ROOM

    listed = worker.ok("GET", "/v1/machines")
    assert {m["id"] for m in listed} == created and len(listed) == ROOM
    capacity = worker.ok("GET", "/v1/capacity")
    assert capacity["reserved"] == {"cpus": ROOM, "memory_mb": ROOM * 256}
    assert capacity["free"]["cpus"] == 0 and capacity["machines"] == ROOM
    offer = worker.ok("POST", "/v1/offers", {"guest": {"cpus": 1, "memory_mb": 256}})
    assert offer["fits"] is False

    # Destroying one makes room for exactly one more.
    worker.ok("DELETE", f"/v1/machines/{sorted(created)[0]}")
    worker.wait(sorted(created)[0], "destroyed")
    assert worker.call("POST", "/v1/machines", body).status == 201
    assert worker.call("POST", "/v1/machines", body).status == 412
