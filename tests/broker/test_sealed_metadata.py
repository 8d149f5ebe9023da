"""Sealed app metadata: stored encrypted by the broker, opened only for tokens that may deploy
the app, left out for every other; `souk deploy` keeps each release's env there."""

from __future__ import annotations

import json
from collections.abc import AsyncIterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp.test_utils import TestClient, TestServer

from souk.broker.fleet import StaticFleet
from souk.broker.server import make_app as make_broker_app
from souk.broker.state import Broker
from souk.broker.tokens import attenuate
from souk.cli.deploy.config import AppConfig
from souk.cli.deploy.releases import (
    AppRecord,
    Release,
    RollbackError,
    recorded,
)
from souk.clients.workers import WorkerClient
from souk.sealing import ENVELOPE, Sealer, Unsealable
from tests.broker.test_app_metadata import ok
from tests.support.broker_cluster import SECRET, Cluster, ClusterFactory, WorkerSpec

META = "/v1/apps/demo/metadata"
PASSWORD = "correct-horse-battery-staple"


@pytest.fixture
async def one(make_cluster: ClusterFactory) -> AsyncIterator[Cluster]:
    async with make_cluster([WorkerSpec("m1", "mad")]) as c:
        yield c


def release_keys() -> tuple[AppConfig, dict[str, str]]:
    """What a deploy recorded for a souk.toml with a secret in its env, before env values went
    to the app's secrets: such releases are still read back to roll back to them."""
    cfg = AppConfig.model_validate(
        {
            "app": "demo",
            "command": ["sleep", "60"],
            "regions": {"mad": 1},
            "env": {"DB_PASSWORD": PASSWORD, "MODE": "prod"},
        }
    )
    record = Release.of(cfg, 1, "rolling", "first").model_copy(update={"env_as_secrets": False})
    return cfg, {**recorded(record), record.env_key(): json.dumps(cfg.env, sort_keys=True)}


def registry_of(c: Cluster) -> Any:
    assert isinstance(c.fleet, StaticFleet)
    return c.fleet.registry


async def test_a_read_only_token_listing_app_metadata_sees_no_env_value(
    one: Cluster, tmp_path: Path
) -> None:
    cfg, keys = release_keys()
    assert set(keys) == {"release.1", "sealed.release.1.env"}
    assert PASSWORD not in keys["release.1"]  # the record names the variables only
    written = await ok(await one.call("PATCH", META, one.tokens["demo"], json={"set": keys}))
    assert written == keys  # the deploy token that wrote them reads them back

    # Tokens that may read the app, even operate its machines, but not deploy it.
    for token in (one.tokens["demo-read"], attenuate(one.tokens["demo"], ["actions=read,write"])):
        resp = await one.call("GET", META, token)
        text = await resp.text()
        assert resp.status == 200, text
        assert PASSWORD not in text and "prod" not in text
        assert set(json.loads(text)) == {"release.1"}
        known = AppRecord.of(json.loads(text))
        (record,) = known.releases
        assert record.env == ["DB_PASSWORD", "MODE"] and "env" not in record.config
        with pytest.raises(RollbackError, match="sealed"):
            known.deployable(record)

    for token in (one.tokens["demo"], one.tokens["operator"], one.tokens["admin"]):
        shown = await ok(await one.call("GET", META, token))
        (record,) = AppRecord.of(shown).releases
        assert AppRecord.of(shown).deployable(record)["env"] == cfg.env

    # Never in plain text where it is kept: the registry's row (what the catalog carries to
    # every replica) holds the sealed form.
    stored = registry_of(one).metadata("demo")
    assert stored["sealed.release.1.env"].startswith(ENVELOPE)
    assert PASSWORD not in json.dumps(stored)


async def test_a_sealed_value_opens_only_where_it_was_sealed(one: Cluster) -> None:
    await ok(await one.call("PATCH", META, json={"set": {"sealed.a": PASSWORD}}))
    registry = registry_of(one)
    moved = registry.metadata("demo")["sealed.a"]
    registry.patch_metadata("demo", {"sealed.b": moved}, [])  # copied to another key
    resp = await one.call("GET", META)
    body = await resp.json()
    assert resp.status == 500 and body["code"] == "sealed_unreadable"
    assert body["details"]["key"] == "sealed.b" and PASSWORD not in json.dumps(body)
    # Deleting it needs no reading.
    await ok(await one.call("PATCH", META, json={"delete": ["sealed.b"]}))
    assert (await ok(await one.call("GET", META)))["sealed.a"] == PASSWORD
    with pytest.raises(Unsealable):  # another cluster's secret opens nothing
        Sealer(b"another-secret-0123456789").open("demo", "sealed.a", moved)
    with pytest.raises(Unsealable):
        Sealer(SECRET).open("other", "sealed.a", moved)


async def test_a_forwarding_broker_leaves_the_sealing_to_the_registry(one: Cluster) -> None:
    registry_url = str(one.broker.make_url("")).rstrip("/")
    other = Broker(one.fleet, WorkerClient(), one.placer, registry_url=registry_url)
    _, keys = release_keys()
    async with TestClient(TestServer(make_broker_app(other, SECRET), host="127.0.0.1")) as client:
        deploy = {"Authorization": f"Bearer {one.tokens['demo']}"}
        assert await ok(await client.patch(META, json={"set": keys}, headers=deploy)) == keys
        reader = {"Authorization": f"Bearer {one.tokens['demo-read']}"}
        assert set(await ok(await client.get(META, headers=reader))) == {"release.1"}
    assert PASSWORD not in json.dumps(registry_of(one).metadata("demo"))


def test_pruned_releases_take_their_env_along() -> None:
    meta = {"release.1": "{}", "sealed.release.1.env": "x", "release.2": "{}", "release.150": "{}"}
    assert sorted(AppRecord.of(meta).stale(150)) == [
        "release.1",
        "release.2",
        "sealed.release.1.env",
    ]
