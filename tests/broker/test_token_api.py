"""Tokens at the broker's door, over real HTTP: what each caveat lets through, introspection,
and revocation reaching every broker through the catalog."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import hmac
import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import aiohttp
from typer.testing import CliRunner

from souk.broker import tokens as tk
from souk.broker.registry import AppRegistry
from souk.broker.runtime import BrokerSettings, broker_site
from souk.broker.tokens import attenuate, mint
from souk.catalog.bus import InProcessBus
from souk.cli.main import app as cli
from tests.broker.test_api import err, ok
from tests.support.broker_cluster import SECRET, Cluster, machine_body

M = "/v1/apps/demo/machines"


def append_raw(token: str, caveat: str) -> str:
    """Chain a caveat without the secret and without attenuate()'s checks, as any holder can."""
    body_text, sig_text = token.removeprefix("souk1_").split(".")
    body = json.loads(base64.urlsafe_b64decode(body_text + "=" * (-len(body_text) % 4)))
    sig = base64.urlsafe_b64decode(sig_text + "=" * (-len(sig_text) % 4))
    new_sig = hmac.new(sig, caveat.encode(), hashlib.sha256).digest()
    body["c"].append(caveat)
    b64 = base64.urlsafe_b64encode(json.dumps(body).encode()).rstrip(b"=").decode()
    return f"souk1_{b64}.{base64.urlsafe_b64encode(new_sig).rstrip(b'=').decode()}"


async def test_a_caveat_nobody_can_check_is_a_401_with_a_reason(small: Cluster) -> None:
    for caveat, reason in [
        ("expires=\u00b2", "caveat_malformed"),
        ("expires=" + "9" * 5000, "caveat_malformed"),
        ("colour=red", "caveat_unknown"),
    ]:
        token = append_raw(small.tokens["demo"], caveat)
        body = await err(await small.call("GET", M, token=token), 401)
        assert body["code"] == reason, body
    expired = attenuate(small.tokens["demo"], ["expires=1"])
    assert (await err(await small.call("GET", M, token=expired), 401))["code"] == "token_expired"


async def test_introspection_shows_what_the_token_allows(small: Cluster) -> None:
    token = attenuate(mint(SECRET), ["apps=demo", "actions=read,write", "expires=99999999999"])
    info = await ok(await small.call("GET", "/v1/tokens/current", token=token))
    assert info == {
        "id": tk.inspect(token)[0],
        "operator": False,
        "actions": ["read", "write"],
        "apps": ["demo"],  # no limit on machines nor regions: left out, never null
        "expires": 99999999999,
        # and Fly's shape beside souk's
        "tokens": [{"token_id": tk.inspect(token)[0], "apps": ["demo"], "org_slug": "personal"}],
    }
    # Even a token limited to one machine may ask what it allows.
    narrow = attenuate(token, ["machines=abcdef"])
    assert (await ok(await small.call("GET", "/v1/tokens/current", token=narrow)))["machines"]


async def test_actions_read_write_deploy(small: Cluster) -> None:
    c = small
    m = await ok(await c.call("POST", M, json=machine_body()))
    stop = f"{M}/{m['id']}/stop"
    reader = attenuate(c.tokens["demo"], ["actions=read"])
    operate = attenuate(c.tokens["demo"], ["actions=read,write"])
    deployer = attenuate(c.tokens["demo"], ["actions=deploy"])
    await ok(await c.call("GET", f"{M}/{m['id']}", token=reader))
    body = await err(await c.call("POST", stop, token=reader), 403)
    assert "read-only" in body["error"]
    await err(await c.call("POST", M, token=operate, json=machine_body()), 403)
    await ok(await c.call("POST", stop, token=operate, json={"signal": "SIGTERM"}))
    await err(await c.call("POST", stop, token=deployer), 403)
    await err(await c.call("GET", M, token=deployer), 403)
    await ok(await c.call("POST", M, token=deployer, json=machine_body()))
    await err(await c.call("PATCH", "/v1/apps/demo/metadata", token=operate, json={}), 403)


async def test_machines_caveat(small: Cluster) -> None:
    c = small
    one = await ok(await c.call("POST", M, json=machine_body()))
    two = await ok(await c.call("POST", M, json=machine_body()))
    token = attenuate(c.tokens["demo"], [f"machines={one['id']}"])
    await ok(await c.call("GET", f"{M}/{one['id']}", token=token))
    await ok(await c.call("POST", f"{M}/{one['id']}/stop", token=token))
    body = await err(await c.call("GET", f"{M}/{two['id']}", token=token), 403)
    assert two["id"] in body["error"]
    await err(await c.call("GET", M, token=token), 403)  # the list shows other machines
    await err(await c.call("POST", M, token=token, json=machine_body()), 403)
    await err(await c.call("GET", "/v1/apps", token=token), 403)


async def test_regions_caveat(small: Cluster) -> None:
    c = small
    mad = attenuate(c.tokens["demo"], ["regions=mad"])
    made = await ok(await c.call("POST", M, token=mad, json=machine_body("mad")))
    await ok(await c.call("GET", f"{M}/{made['id']}", token=mad))  # just placed: by the hint
    body = await err(await c.call("POST", M, token=mad, json=machine_body("ams")), 403)
    assert "'ams'" in body["error"]
    elsewhere = await ok(await c.call("POST", M, json=machine_body("ams")))
    await err(await c.call("GET", f"{M}/{elsewhere['id']}", token=mad), 403)
    await err(await c.call("POST", f"{M}/{elsewhere['id']}/stop", token=mad), 403)
    listed = await ok(await c.call("GET", M, token=mad, params={"region": "mad"}))
    assert {m["region"] for m in listed} == {"mad"}
    await err(await c.call("GET", M, token=mad), 403)
    await err(await c.call("GET", M, token=mad, params={"region": "ams"}), 403)
    # No region in the body: refused by the caveat before the body's other problems.
    await err(await c.call("POST", M, token=mad, json={"config": {}}), 403)


async def test_apps_caveat_on_a_create_reads_the_name_from_the_body(small: Cluster) -> None:
    c = small
    token = attenuate(mint(SECRET), ["apps=shop"])
    await err(await c.call("POST", "/v1/apps", token=token, json={"name": "other"}), 403)
    await ok(await c.call("POST", "/v1/apps", token=token, json={"name": "shop"}), 201)
    body = await err(await c.call("POST", "/v1/apps", token=token, data=b"[" * 100_000), 400)
    assert body["code"] == "invalid_json"


async def test_fleet_operations_and_caveats(small: Cluster) -> None:
    c = small
    op = c.tokens["operator"]
    reader = attenuate(op, ["actions=read"])
    await ok(await c.call("GET", "/v1/workers", token=reader))
    await err(await c.call("POST", "/v1/workers/m1/cordon", token=reader), 403)
    scoped = attenuate(op, ["apps=demo"])
    body = await err(await c.call("GET", "/v1/workers", token=scoped), 403)
    assert "fleet" in body["error"]
    await err(await c.call("DELETE", "/v1/tokens/0123456789abcdef", token=scoped), 403)


async def test_revocation_on_one_broker(small: Cluster) -> None:
    c = small
    victim = mint(SECRET, apps=["demo"])
    copy = attenuate(victim, ["actions=read"])
    victim_id = tk.inspect(victim)[0]
    await ok(await c.call("GET", M, token=copy))
    await err(await c.call("DELETE", f"/v1/tokens/{victim_id}", token=c.tokens["admin"]), 403)
    await err(await c.call("DELETE", f"/v1/tokens/{victim_id}", token=victim), 403)
    body = await err(await c.call("DELETE", "/v1/tokens/nope", token=c.tokens["operator"]), 400)
    assert body["code"] == "invalid"
    row = await ok(await c.call("DELETE", f"/v1/tokens/{victim_id}", token=c.tokens["operator"]))
    assert row["id"] == victim_id
    again = await ok(await c.call("DELETE", f"/v1/tokens/{victim_id}", token=c.tokens["operator"]))
    assert again == row  # idempotent
    for token in (victim, copy):
        body = await err(await c.call("GET", M, token=token), 401)
        assert body["code"] == "token_revoked"
    listed = await ok(await c.call("GET", "/v1/tokens/revoked", token=c.tokens["operator"]))
    assert [r["id"] for r in listed] == [victim_id]
    await ok(await c.call("GET", M, token=c.tokens["demo"]))  # other tokens are untouched


@contextlib.asynccontextmanager
async def two_brokers(tmp_path: Path) -> AsyncIterator[tuple[str, str]]:
    """A broker hosting the app registry and one forwarding to it, both on one catalog."""
    bus = InProcessBus()
    try:
        home = BrokerSettings(
            host="127.0.0.1", port=0, secret=SECRET, workers=[], registry_dir=tmp_path / "registry"
        )
        async with broker_site(home, bus) as home_url:
            other = BrokerSettings(
                host="127.0.0.1", port=0, secret=SECRET, workers=[], registry_url=home_url
            )
            async with broker_site(other, bus) as other_url:
                yield home_url, other_url
    finally:
        await bus.close()


async def status_of(session: aiohttp.ClientSession, url: str, token: str) -> tuple[int, Any]:
    async with session.get(url + "/v1/apps", headers={"Authorization": f"Bearer {token}"}) as r:
        return r.status, await r.json()


async def test_a_revocation_reaches_every_broker(tmp_path: Path) -> None:
    victim = mint(SECRET)
    victim_id = tk.inspect(victim)[0]
    op = {"Authorization": f"Bearer {mint(SECRET, operator=True)}"}
    async with two_brokers(tmp_path) as (home, other), aiohttp.ClientSession() as session:
        for url in (home, other):
            assert (await status_of(session, url, victim))[0] == 200
        # Revoked through the broker without the registry: forwarded to it.
        async with session.delete(f"{other}/v1/tokens/{victim_id}", headers=op) as resp:
            assert resp.status == 200, await resp.text()
        assert (await status_of(session, home, victim))[1]["code"] == "token_revoked"
        for _ in range(200):  # the other broker learns it from the catalog
            status, body = await status_of(session, other, victim)
            if status == 401:
                break
            await asyncio.sleep(0.01)
        assert body["code"] == "token_revoked"
        assert (await status_of(session, other, mint(SECRET)))[0] == 200
    # The registry keeps it across a restart.
    registry = AppRegistry(tmp_path / "registry" / "apps.db")
    try:
        assert registry.revoked(victim_id)
    finally:
        registry.close()


def test_the_registry_publishes_revocations_on_its_sequence(tmp_path: Path) -> None:
    registry = AppRegistry(tmp_path / "apps.db")
    try:
        registry.create("demo")
        row = registry.revoke("0123456789abcdef")
        assert registry.revoke("0123456789abcdef") == row
        registry.create("shop")
        changes, head, more = registry.changes_since(0, 10)
        assert [(c.table, c.key, c.seq) for c in changes] == [
            ("apps", "demo", 1),
            ("revocations", "0123456789abcdef", 2),
            ("apps", "shop", 3),
        ]
        assert (head, more) == (3, False)
        changes, head, more = registry.changes_since(1, 1)
        assert [c.key for c in changes] == ["0123456789abcdef"] and (head, more) == (2, True)
    finally:
        registry.close()


async def test_souk_tokens_revoke(small: Cluster) -> None:
    victim = mint(SECRET)
    api = str(small.broker.make_url("")).rstrip("/")
    args = ["tokens", "revoke", tk.inspect(victim)[0], "--api", api]
    runner = CliRunner()
    refused = await asyncio.to_thread(runner.invoke, cli, [*args, "--token", victim])
    assert refused.exit_code == 1 and "403" in refused.output
    done = await asyncio.to_thread(runner.invoke, cli, [*args, "--token", small.tokens["operator"]])
    assert done.exit_code == 0, done.output
    body = await err(await small.call("GET", M, token=victim), 401)
    assert body["code"] == "token_revoked"
