"""Each app's machines get addresses on its private network: the org's default unless the app
was created on another (Fly's `network` on POST /v1/apps), which no metadata patch changes."""

from __future__ import annotations

import ipaddress
import os
from typing import Any

import pytest

from souk.models.wire import NETWORK_KEY
from souk.worker.machines.addresses import DEFAULT_PREFIX
from tests.support.broker_cluster import Cluster, machine_body

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="a root worker isolates its machines")


async def ok(resp: Any, status: int = 200) -> Any:
    assert resp.status == status, await resp.text()
    return await resp.json()


def network(address: str) -> ipaddress.IPv6Network:
    return ipaddress.IPv6Network(f"{address}/72", strict=False)


async def test_apps_of_one_network_share_its_prefix_and_others_do_not(small: Cluster) -> None:
    apps = {
        "alpha": {"org_slug": "acme"},
        "gamma": {"org_slug": "acme"},
        "beta": {"org_slug": "acme", "network": "db"},
        "beta2": {"org_slug": "acme", "network": "db"},
        "delta": {"org_slug": "globex"},
    }
    seen: dict[str, str] = {}
    for name, fields in apps.items():
        await ok(await small.call("POST", "/v1/apps", json={"name": name, **fields}), 201)
        machine = await ok(
            await small.call("POST", f"/v1/apps/{name}/machines", json=machine_body())
        )
        seen[name] = machine["private_ip"]
        assert ipaddress.ip_address(seen[name]) in ipaddress.ip_network(DEFAULT_PREFIX)
    assert network(seen["alpha"]) == network(seen["gamma"])  # the org's default
    assert network(seen["beta"]) == network(seen["beta2"])  # created on the same network
    assert network(seen["alpha"]) != network(seen["beta"])
    assert network(seen["alpha"]) != network(seen["delta"])  # another org's default


async def test_an_apps_network_is_not_patched_and_names_are_checked(small: Cluster) -> None:
    await ok(await small.call("POST", "/v1/apps", json={"name": "eps", "network": "db"}), 201)
    meta = await ok(await small.call("GET", "/v1/apps/eps/metadata"))
    assert meta[NETWORK_KEY] == "db"
    for patch in ({"set": {NETWORK_KEY: "other"}}, {"delete": [NETWORK_KEY]}):
        resp = await small.call("PATCH", "/v1/apps/eps/metadata", json=patch)
        assert resp.status == 400 and (await resp.json())["code"] == "invalid"
    assert (await ok(await small.call("GET", "/v1/apps/eps/metadata")))[NETWORK_KEY] == "db"
    resp = await small.call("POST", "/v1/apps", json={"name": "zeta", "network": "Bad Net!"})
    assert resp.status == 400
