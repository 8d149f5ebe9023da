"""Stops and metadata, over real HTTP to a worker running real processes and a broker: a bad
signal or oversized metadata is a 4xx with a reason, never a machine stuck half-way."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest

from souk.models.machine import (
    MAX_METADATA_BYTES,
    MetadataTooLarge,
    StopConfig,
    StopRequest,
    check_metadata_size,
)
from tests.web.conftest import Servers

SLEEP = {"init": {"exec": ["sleep", "600"]}}
M = "/v1/apps/demo/machines"


@pytest.fixture
async def http(servers: Servers) -> AsyncIterator[aiohttp.ClientSession]:
    headers = {"Authorization": f"Bearer {servers.token}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        yield session


async def call(
    session: aiohttp.ClientSession, method: str, url: str, body: Any = None
) -> tuple[int, Any]:
    async with session.request(method, url, json=body) as resp:
        text = await resp.text()
        return resp.status, json.loads(text) if text else None


@pytest.mark.parametrize("signal", ["TERM", "sigterm", "SIGTERM", "term", "SigTerm"])
def test_signal_names_are_normalized_alike_in_configs_and_stops(signal: str) -> None:
    assert StopRequest(signal=signal).signal == "SIGTERM"
    assert StopConfig(signal=signal).signal == "SIGTERM"


@pytest.mark.parametrize("signal", ["15", "9", "SIGBOGUS", "BOGUS", "", "SIG", "SIGTERM ", "-15"])
def test_numbers_and_unknown_names_are_refused(signal: str) -> None:
    for model in (StopRequest, StopConfig):
        with pytest.raises(ValueError, match="unknown signal"):
            model(signal=signal)


async def test_a_stop_with_a_bad_signal_is_a_400_and_the_machine_keeps_running(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    status, m = await call(http, "POST", servers.broker + M, {"region": "mad", "config": SLEEP})
    assert status == 200, m
    machine = f"{M}/{m['id']}"
    try:
        status, body = await call(
            http, "GET", servers.broker + machine + "/wait?state=started&timeout=20"
        )
        assert status == 200, body
        for signal in ["15", "SIGBOGUS", "sig term"]:
            for url in (servers.broker + machine, f"{servers.worker}/v1/machines/{m['id']}"):
                status, body = await call(http, "POST", url + "/stop", {"signal": signal})
                assert (status, body["code"]) == (400, "invalid"), (url, body)
                assert body["details"]["problems"][0]["field"] == "signal"
        status, got = await call(http, "GET", servers.broker + machine)
        assert got["state"] == "started"
        # A name without SIG is SIGTERM: the process stops, the machine does not hang.
        status, body = await call(
            http, "POST", servers.broker + machine + "/stop", {"signal": "TERM"}
        )
        assert status == 200, body
        status, body = await call(
            http, "GET", servers.broker + machine + "/wait?state=stopped&timeout=20"
        )
        assert status == 200, body
    finally:
        await call(http, "DELETE", servers.broker + machine + "?force=true")


def test_the_metadata_limit_counts_keys_and_values() -> None:
    fits = {"k": "v" * (MAX_METADATA_BYTES - 1)}
    check_metadata_size(fits)
    with pytest.raises(MetadataTooLarge):
        check_metadata_size({"kk": "v" * (MAX_METADATA_BYTES - 1)})
    with pytest.raises(MetadataTooLarge):  # bytes, not characters
        check_metadata_size({"k": "\u00e9" * (MAX_METADATA_BYTES // 2)})


async def test_oversized_metadata_is_a_413(servers: Servers, http: aiohttp.ClientSession) -> None:
    big = {f"key{i}": "x" * 1000 for i in range(70)}  # ~70 KiB
    config = {**SLEEP, "metadata": big}
    status, body = await call(http, "POST", servers.broker + M, {"region": "mad", "config": config})
    assert (status, body["code"]) == (413, "metadata_too_large"), body
    worker_body = {"app": "demo", "start": False, "config": config}
    status, body = await call(http, "POST", servers.worker + "/v1/machines", worker_body)
    assert (status, body["code"]) == (413, "metadata_too_large"), body
    status, m = await call(http, "POST", servers.broker + M, {"region": "mad", "config": SLEEP})
    assert status == 200, m
    try:
        url = f"{servers.broker}{M}/{m['id']}/metadata"
        status, body = await call(http, "PATCH", url, {"metadata": big})
        assert (status, body["code"]) == (413, "metadata_too_large"), body
        status, _ = await call(http, "PATCH", url, {"metadata": {"a": "b"}})
        assert status == 204
    finally:
        await call(http, "DELETE", f"{servers.broker}{M}/{m['id']}?force=true")
