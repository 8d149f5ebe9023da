"""Bounds on what one config can multiply (models/limits.py), over real HTTP with an app token:
at its limit a config is taken, one over it is a 400 `limit_exceeded` from the broker and from
the worker alike. Before them, 300 checks of `interval: "0s"` held half a core of a worker, and
a stop timeout of 99999999999999h made a machine that ignores SIGTERM indestructible."""

from __future__ import annotations

import base64
from collections.abc import AsyncIterator, Callable
from typing import Any

import aiohttp
import pytest
from pydantic import ValidationError

from souk.models import limits
from souk.models.machine import MachineConfig
from tests.web.conftest import Servers
from tests.web.test_bad_input import SLEEP, call

M = "/v1/apps/demo/machines"
TCP = {"type": "tcp", "port": 8080}

Config = dict[str, Any]


def services(n: int, **service: Any) -> Config:
    return {**SLEEP, "services": [{"internal_port": 8080 + i, **service} for i in range(n)]}


def files(n: int) -> Config:
    return {**SLEEP, "files": [{"guest_path": f"/f{i}", "raw_value": ""} for i in range(n)]}


def file_bytes(n: int) -> Config:
    """One file whose raw_value is `n` characters of base64, rounded up to a whole quantum."""
    raw = base64.b64encode(b"\0" * (-(-n // 4) * 3)).decode()
    return {**SLEEP, "files": [{"guest_path": "/big", "raw_value": raw}]}


def processes(**process: Any) -> Config:
    return {**SLEEP, "processes": [{"exec": ["sleep", "600"], **process}]}


# name -> (limit, config with n of the thing)
COUNTED: dict[str, tuple[int, Callable[[int], Config]]] = {
    "checks": (limits.MAX_CHECKS, lambda n: {**SLEEP, "checks": {f"c{i}": TCP for i in range(n)}}),
    "checks with services'": (
        limits.MAX_CHECKS,
        lambda n: {
            **services(1, checks=[{"type": "tcp"}] * (n - 1)),
            "checks": {"own": TCP},
        },
    ),
    "check headers": (
        limits.MAX_CHECK_HEADERS,
        lambda n: {
            **SLEEP,
            "checks": {"h": {**TCP, "type": "http", "path": "/", "headers": [{"name": "A"}] * n}},
        },
    ),
    "check header bytes": (
        limits.MAX_CHECK_HEADER_BYTES,
        lambda n: {
            **SLEEP,
            "checks": {
                "h": {
                    **TCP,
                    "type": "http",
                    "path": "/",
                    "headers": [{"name": "A", "values": ["v" * (n - 1)]}],
                }
            },
        },
    ),
    "check path bytes": (
        limits.MAX_CHECK_PATH,
        lambda n: {**SLEEP, "checks": {"h": {**TCP, "type": "http", "path": "/" * n}}},
    ),
    "processes": (
        limits.MAX_PROCESSES,
        lambda n: {**SLEEP, "processes": [{"exec": ["sleep", "600"]}] * n},
    ),
    "files": (limits.MAX_FILES, files),
    "files' bytes": (limits.MAX_FILES_BYTES, file_bytes),
    "services": (limits.MAX_SERVICES, services),
    "ports": (
        limits.MAX_PORTS,
        lambda n: services(1, ports=[{"port": 1000 + i} for i in range(n)]),
    ),
    "env": (limits.MAX_ENV, lambda n: {**SLEEP, "env": {f"E{i}": "v" for i in range(n)}}),
    "a process's env": (
        limits.MAX_ENV,
        lambda n: processes(env={f"E{i}": "v" for i in range(n)}),
    ),
    "env_from": (
        limits.MAX_ENV_FROM,
        lambda n: processes(env_from=[{"env_var": f"E{i}", "field_ref": "id"} for i in range(n)]),
    ),
    "init.exec's arguments": (
        limits.MAX_ARGS,
        lambda n: {"init": {"exec": ["sleep", *["600"] * (n - 1)]}},
    ),
    "init.cmd's arguments": (
        limits.MAX_ARGS,
        lambda n: {"init": {"exec": ["sleep", "600"], "cmd": ["x"] * n}},
    ),
    "an argument's bytes": (
        limits.MAX_ARG_BYTES,
        lambda n: {"init": {"exec": ["sleep", "600", "x" * n]}},
    ),
    "a process's arguments": (
        limits.MAX_ARGS,
        lambda n: processes(exec=["sleep", *["600"] * (n - 1)]),
    ),
    "standbys": (
        limits.MAX_STANDBYS,
        lambda n: {**SLEEP, "standbys": [f"m{i:05d}" for i in range(n)]},
    ),
}


def check(**fields: Any) -> Config:
    return {**SLEEP, "checks": {"c": {**TCP, **fields}}}


# name -> (a config at the bound, one just past it)
TIMED: dict[str, tuple[Config, Config]] = {
    "a check's interval": (check(interval="1s"), check(interval="999ms")),
    "a check's interval, at most": (check(interval="1h"), check(interval="3600001ms")),
    "a check's timeout": (check(timeout="60s"), check(timeout="60001ms")),
    "a check's grace period": (check(grace_period="1h"), check(grace_period="3601s")),
    "stop_config.timeout": (
        {**SLEEP, "stop_config": {"timeout": "5m"}},
        {**SLEEP, "stop_config": {"timeout": "300001ms"}},
    ),
}


@pytest.fixture
async def http(servers: Servers) -> AsyncIterator[aiohttp.ClientSession]:
    headers = {"Authorization": f"Bearer {servers.token}"}
    async with aiohttp.ClientSession(headers=headers) as session:
        yield session


async def refused_by_both(
    servers: Servers, http: aiohttp.ClientSession, config: Config, reason: str = "limit_exceeded"
) -> str:
    """The broker's and the worker's refusal of `config` (both must refuse it); the message."""
    status = 413 if reason == "metadata_too_large" else 400
    body = {"region": "mad", "config": config, "skip_launch": True}
    got, answer = await call(http, "POST", servers.broker + M, body)
    assert (got, answer["code"]) == (status, reason), answer
    worker = {"app": "demo", "config": config, "start": False}
    got, direct = await call(http, "POST", servers.worker + "/v1/machines", worker)
    assert (got, direct["code"]) == (status, reason), direct
    assert direct["error"] == answer["error"]
    return str(answer["error"])


async def taken(servers: Servers, http: aiohttp.ClientSession, config: Config) -> None:
    body = {"region": "mad", "config": config, "skip_launch": True}
    got, machine = await call(http, "POST", servers.broker + M, body)
    assert got == 200, machine


@pytest.mark.parametrize("name", sorted(COUNTED))
async def test_a_count_at_its_limit_is_taken_and_one_more_refused(
    servers: Servers, http: aiohttp.ClientSession, name: str
) -> None:
    limit, make = COUNTED[name]
    message = await refused_by_both(servers, http, make(limit + 1))
    assert str(limit) in message, message
    await taken(servers, http, make(limit))


@pytest.mark.parametrize("name", sorted(TIMED))
async def test_a_duration_at_its_bound_is_taken_and_past_it_refused(
    servers: Servers, http: aiohttp.ClientSession, name: str
) -> None:
    at, past = TIMED[name]
    await refused_by_both(servers, http, past)
    await taken(servers, http, at)


async def test_the_review_s_configs_are_refused(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    many = {f"c{i}": {**TCP, "interval": "1s"} for i in range(300)}
    assert "at most 10 checks" in await refused_by_both(servers, http, {**SLEEP, "checks": many})
    spinning = check(interval="0s")
    assert "interval" in await refused_by_both(servers, http, spinning)
    forever = {**SLEEP, "stop_config": {"timeout": "99999999999999h"}}
    assert "timeout" in await refused_by_both(servers, http, forever)


async def test_a_stop_s_own_timeout_is_bounded_too(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    body = {"region": "mad", "config": SLEEP, "skip_launch": True}
    status, m = await call(http, "POST", servers.broker + M, body)
    assert status == 200, m
    for url in (f"{servers.broker}{M}/{m['id']}", f"{servers.worker}/v1/machines/{m['id']}"):
        status, answer = await call(http, "POST", url + "/stop", {"timeout": "99999999999999h"})
        assert (status, answer["code"]) == (400, "limit_exceeded"), answer


async def test_metadata_keys_are_counted(servers: Servers, http: aiohttp.ClientSession) -> None:
    def keyed(n: int) -> Config:
        return {**SLEEP, "metadata": {f"k{i}": "v" for i in range(n)}}

    await refused_by_both(
        servers, http, keyed(limits.MAX_METADATA_ENTRIES + 1), "metadata_too_large"
    )
    await taken(servers, http, keyed(limits.MAX_METADATA_ENTRIES))


async def test_a_second_mount_is_over_the_limit(
    servers: Servers, http: aiohttp.ClientSession
) -> None:
    mounts = [{"volume": f"vol_{c * 16}", "path": f"/{c}"} for c in "ab"]
    await refused_by_both(servers, http, {**SLEEP, "mounts": mounts})


def test_a_config_stored_before_the_limits_still_loads() -> None:
    """Rows are read without the request context: a worker restarted with a machine made
    before a limit existed still loads it, and can stop or destroy it."""
    over = {**SLEEP, "checks": {f"c{i}": {**TCP, "interval": "0s"} for i in range(300)}}
    stored = MachineConfig.model_validate(over)
    assert MachineConfig.model_validate_json(stored.model_dump_json()) == stored
    with pytest.raises(ValidationError, match="between 1 and 3600"):
        MachineConfig.model_validate(over, context=limits.INCOMING)
