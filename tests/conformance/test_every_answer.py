"""Every route of the broker's table that answers JSON, called once in a small scenario: no
answer holds a null anywhere (Fly's answers leave empty fields out, and typed clients refuse a
null where they expect a value), and machines, events and volumes hold no empty list or map.
A route added to the table without a step here fails `test_every_json_route_is_walked`."""

from __future__ import annotations

import sys
from typing import Any

from souk.broker.api.routes import ROUTES
from tests.conformance.fly_spec import no_empties, no_nulls
from tests.support.broker_cluster import Cluster

A = "/v1/apps/walk"
M = f"{A}/machines/{{id}}"
V = f"{A}/volumes/{{volume}}"
CONFIG = {"init": {"exec": [sys.executable, "-c", "import time; time.sleep(600)"]}}

# (method, path, body or None): in order; {id} is the machine made by the third step.
STEPS: list[tuple[str, str, Any]] = [
    ("POST", "/v1/apps", {"name": "walk"}),
    ("GET", "/v1/apps", None),
    ("POST", f"{A}/machines", {"region": "mad", "config": CONFIG}),
    ("GET", A, None),
    ("PATCH", f"{A}/metadata", {"metadata": {"team": "a"}}),
    ("GET", f"{A}/metadata", None),
    ("POST", f"{A}/secrets", {"values": {"S": "c2VjcmV0"}}),
    ("GET", f"{A}/secrets", None),
    ("POST", f"{A}/secrets/{{secret_name}}", {"value": "c2VjcmV0"}),
    ("GET", f"{A}/secrets/{{secret_name}}", None),
    ("DELETE", f"{A}/secrets/{{secret_name}}", None),
    ("GET", f"{A}/machines", None),
    ("POST", f"{A}/images/pin", {"image": "registry.invalid/x:1", "region": "mad"}),
    ("GET", M, None),
    ("GET", f"{M}/wait", None),
    ("GET", f"{M}/events", None),
    ("GET", f"{M}/placement", None),
    ("POST", f"{M}/cordon", None),
    ("POST", f"{M}/uncordon", None),
    ("GET", f"{M}/metadata", None),
    ("POST", f"{M}/lease", {"ttl": 10}),
    ("GET", f"{M}/lease", None),
    ("DELETE", f"{M}/lease", None),
    ("POST", f"{M}/exec", {"command": ["true"]}),
    ("GET", f"{M}/ps", None),
    ("GET", f"{M}/versions", None),
    ("POST", f"{M}/signal", {"signal": "SIGUSR2"}),
    ("POST", f"{M}/suspend", None),
    ("POST", f"{M}/start", None),
    ("POST", f"{M}/restart", None),
    ("POST", f"{M}/stop", None),
    ("PUT", M, {"config": CONFIG, "skip_launch": True}),
    ("POST", M, {"config": CONFIG, "skip_launch": True}),
    ("POST", f"{A}/deploy_token", {}),
    ("GET", "/v1/orgs/personal/machines", None),
    ("GET", "/v1/platform/regions", None),
    ("POST", "/v1/platform/placements", {"count": 2}),
    ("GET", "/v1/workers", None),
    ("GET", "/v1/tokens/current", None),
    ("GET", "/v1/tokens/revoked", None),
    ("DELETE", "/v1/tokens/{token}", None),
    ("GET", "/v1/prometheus/targets", None),
    ("GET", f"{A}/volumes", None),
    ("POST", f"{A}/volumes", {"name": "d", "size_mb": 16, "region": "mad"}),
    ("GET", V, None),
    ("PUT", V, {"snapshot_retention": 3}),
    ("PUT", f"{V}/extend", {"size_mb": 32}),
    ("GET", f"{V}/snapshots", None),
    ("POST", f"{V}/snapshots", None),
    ("DELETE", V, None),
    ("DELETE", M, {"force": True}),
]

# Routes whose answer is not a JSON document, or answers nothing, or that end what the walk uses.
NOT_JSON = {
    ("DELETE", "/v1/apps/{app}"),
    ("GET", "/v1/apps/{app}/machines/{id}/logs"),
    ("PATCH", "/v1/apps/{app}/machines/{id}/metadata"),
    ("POST", "/v1/apps/{app}/machines/{id}/metadata/{key}"),
    ("DELETE", "/v1/apps/{app}/machines/{id}/metadata/{key}"),
    ("POST", "/v1/workers/{worker}/cordon"),
    ("POST", "/v1/workers/{worker}/uncordon"),
    ("GET", "/metrics"),
}


def fly_shaped(answer: Any) -> bool:
    """A machine (its config), an event or a volume, or a list of them."""
    items = answer if isinstance(answer, list) else [answer]
    keys = ({"config"}, {"type", "timestamp"}, {"size_gb"})
    return any(isinstance(i, dict) and any(k <= i.keys() for k in keys) for i in items)


def _template(path: str) -> str:
    for name, value in (("walk", "{app}"), ("personal", "{org}"), ("{volume}", "{id}")):
        path = path.replace(name, value)
    return path.replace("{token}", "{id:(?!current$|revoked$)[^/]+}")


def test_every_json_route_is_walked() -> None:
    walked = {(method, _template(path)) for method, path, _ in STEPS}
    table = {
        (r.method, r.path) for r in ROUTES if not r.path.startswith("/ui") and r.path != "/metrics"
    }
    missing = table - walked - NOT_JSON
    assert not missing, f"routes with no step in the walk: {sorted(missing)}"


async def test_no_answer_holds_a_null(fly: Cluster) -> None:
    c = fly
    found: dict[str, str] = {"volume": "vol_none", "secret_name": "T"}
    for method, path, body in STEPS:
        if path == "/v1/tokens/{token}":
            deploy = await (await c.call("POST", f"{A}/deploy_token", json={})).json()
            current = await c.call("GET", "/v1/tokens/current", token=deploy["token"])
            found["token"] = (await current.json())["id"]
        url = path.format(**found)
        params = {"force": "true"} if isinstance(body, dict) and body.get("force") else None
        kw: dict[str, Any] = {"params": params} if params else {}
        if body is not None and not params:
            kw["json"] = body
        resp = await c.call(method, url, **kw)
        text = await resp.text()
        gateway = resp.status in (502, 503) and url.endswith("/images/pin")  # no registry here
        assert resp.status < 500 or gateway, f"{method} {url}: {resp.status} {text}"
        if not text:
            continue
        answer = await resp.json()
        no_nulls(answer, f"{method} {url}")
        if resp.status < 300 and fly_shaped(answer):
            no_empties(answer, f"{method} {url}")
        if method == "POST" and url == f"{A}/machines":
            found["id"] = answer["id"]
        if method == "POST" and url == f"{A}/volumes" and resp.status == 200:
            found["volume"] = answer["id"]
