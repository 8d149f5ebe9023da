"""A worker serving mutual TLS, walked route by route from its own route table: with no
certificate, with another CA's, with an expired one and with each role's, every answer is the
one its route table gives."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from souk.pki import ROLES, client_context
from souk.web import undeclared
from souk.web.routes import DECLARED
from tests.security.conftest import TlsWorker, tls_worker
from tests.support.pki import Pki

NO_SUCH_MACHINE = "m0nothere"
Answer = tuple[int | str, Any]  # ("refused", why) when TLS turned the connection away


def route_keys(worker: TlsWorker) -> list[str]:
    """Every route the worker serves, as the table names them (HEAD goes with GET)."""
    keys = []
    for route in worker.app.router.routes():
        if route.method != "HEAD" and route.resource is not None:
            keys.append(f"{route.method} {route.resource.canonical}")
    return keys


async def ask(session: aiohttp.ClientSession, base: str, key: str, ctx: ssl.SSLContext) -> Answer:
    """(status, JSON body), or ("refused", why) if TLS turned the connection away. Bodies and
    queries are left out: a caller let through is answered by the handler (400, 404...)."""
    method, path = key.split(" ")
    url = base + path.replace("{id}", NO_SUCH_MACHINE).replace("{inode}", "1")
    try:
        async with session.request(method, url, ssl=ctx, server_hostname="w1") as resp:
            if resp.content_type == "application/json":
                return resp.status, await resp.json()
            return resp.status, await resp.text()  # /metrics: Prometheus' text format
    except aiohttp.ClientConnectionError as exc:
        return "refused", str(exc)


async def walk(worker: TlsWorker, ctx: ssl.SSLContext) -> dict[str, Answer]:
    async with aiohttp.ClientSession() as session:
        return {key: await ask(session, worker.url, key, ctx) for key in route_keys(worker)}


def anonymous(pki: Pki) -> ssl.SSLContext:
    """Trusts the cluster CA, shows no certificate."""
    ctx = ssl.create_default_context(cafile=pki.ca_dir / "ca.crt")
    ctx.minimum_version = ssl.TLSVersion.TLSv1_3
    return ctx


def allowed(worker: TlsWorker, key: str) -> frozenset[str]:
    """The roles the worker's route table gives the route (HEAD goes with GET)."""
    method, path = key.split(" ")
    return worker.app[DECLARED][(method, path)].roles


async def test_the_table_rules_every_route_and_only_served_routes(tmp_path: Path, pki: Pki) -> None:
    async with tls_worker(tmp_path, pki, "w1") as worker:
        assert undeclared(worker.app) == []
        declared = worker.app[DECLARED]
        assert sorted(f"{m} {p}" for m, p in declared) == sorted(route_keys(worker))
        assert all(route.roles for route in declared.values()), "a route no role may call"


@pytest.mark.parametrize("role", ROLES)
async def test_each_role_is_answered_as_the_table_says(tmp_path: Path, pki: Pki, role: str) -> None:
    ctx = client_context(pki.node(role, f"{role}-1"))
    async with tls_worker(tmp_path, pki, "w1") as worker:
        answers = await walk(worker, ctx)
    for key, (status, body) in answers.items():
        roles = allowed(worker, key)
        if role in roles:
            assert isinstance(status, int) and status not in (401, 403), (key, status, body)
        else:
            assert status == 403, (key, status, body)
            assert body["code"] == "forbidden"
            assert body["details"] == {"role": role, "allowed": sorted(roles)}


async def test_operators_and_brokers_get_real_answers(tmp_path: Path, pki: Pki) -> None:
    ctx = client_context(pki.node("broker", "b1"))
    async with tls_worker(tmp_path, pki, "w1") as worker, aiohttp.ClientSession() as session:
        status, capacity = await ask(session, worker.url, "GET /v1/capacity", ctx)
        assert status == 200 and capacity["worker"] == "w1"
        status, body = await ask(session, worker.url, "GET /v1/machines/{id}", ctx)
        assert status == 404 and body["code"] == "not_found"


async def test_without_a_certificate_every_route_is_401(tmp_path: Path, pki: Pki) -> None:
    async with tls_worker(tmp_path, pki, "w1") as worker:
        answers = await walk(worker, anonymous(pki))
        async with aiohttp.ClientSession() as session:
            unknown = await ask(session, worker.url, "GET /v1/nothing-here", anonymous(pki))
    assert answers
    for key, (status, body) in [*answers.items(), ("GET /v1/nothing-here", unknown)]:
        assert status == 401, (key, status, body)
        assert body["code"] == "unauthorized"


async def test_plain_http_to_a_tls_worker_gets_nothing(tmp_path: Path, pki: Pki) -> None:
    async with tls_worker(tmp_path, pki, "w1") as worker, aiohttp.ClientSession() as session:
        plain = worker.url.replace("https://", "http://") + "/v1/capacity"
        with pytest.raises(aiohttp.ClientError):
            async with session.get(plain) as resp:
                await resp.read()


async def test_another_cas_certificate_is_turned_away_on_every_route(
    tmp_path: Path, pki: Pki, other_pki: Pki
) -> None:
    stranger = other_pki.node("operator", "mallory")
    ctx = anonymous(pki)  # trusts the worker, shows a certificate the worker does not trust
    ctx.load_cert_chain(stranger.cert, stranger.key)
    async with tls_worker(tmp_path, pki, "w1") as worker:
        answers = await walk(worker, ctx)
    assert answers
    assert {status for status, _ in answers.values()} == {"refused"}


async def test_an_expired_certificate_is_turned_away_on_every_route(
    tmp_path: Path, pki: Pki
) -> None:
    ctx = client_context(pki.node("operator", "old-op", age_days=40))
    async with tls_worker(tmp_path, pki, "w1") as worker:
        answers = await walk(worker, ctx)
    assert answers
    assert {status for status, _ in answers.values()} == {"refused"}
