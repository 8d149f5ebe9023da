"""A Fly client's whole scenario against a real broker and workers: every response body is
checked against Fly's spec (JSON Schema and Go-style strict types), status codes included."""

from __future__ import annotations

import asyncio
import sys
import time
from typing import Any

from tests.conformance.fly_spec import no_empties, no_nulls, validate
from tests.support.broker_cluster import Cluster

A = "/v1/apps/flyish"
M = f"{A}/machines"

# Answers 200 only to HEAD with the check's header, so a passing check proves both were sent.
PICKY = """
import http.server, os, socket
class H(http.server.BaseHTTPRequestHandler):
    def do_HEAD(self):
        self.send_response(200 if self.headers.get("X-Souk-Check") == "yes" else 418)
        self.end_headers()
    do_GET = do_HEAD
    def log_message(self, *args):
        pass
ip = os.environ["SOUK_PRIVATE_IP"]
class S(http.server.HTTPServer):
    address_family = socket.AF_INET6 if ":" in ip else socket.AF_INET
S((ip, 8080), H).serve_forever()
"""


async def call(
    c: Cluster,
    method: str,
    path: str,
    status: int = 200,
    definition: str | None = None,
    array: bool = False,
    **kw: Any,
) -> Any:
    """The request's body, after checking its status and, if named, its spec definition; an
    error body is always checked as the spec's ErrorResponse. No answer holds a null, and no
    machine or event an empty list or map (Go's omitempty, which Fly's clients expect)."""
    resp = await c.call(method, path, **kw)
    text = await resp.text()
    assert resp.status == status, f"{method} {path}: {resp.status} {text}"
    body = await resp.json() if text else None
    if body is not None:
        no_nulls(body, f"{method} {path}")
    if status >= 400:
        validate(body, "ErrorResponse")
    elif definition is not None:
        validate(body, definition, array)
        if definition in ("Machine", "MachineEvent"):
            no_empties(body, f"{method} {path}")
    return body


async def until(c: Cluster, mid: str, done: Any, timeout: float = 30) -> dict[str, Any]:
    deadline = time.monotonic() + timeout
    while True:
        machine = await call(c, "GET", f"{M}/{mid}", definition="Machine")
        if done(machine) or time.monotonic() > deadline:
            return dict(machine)
        await asyncio.sleep(0.1)


async def test_a_fly_clients_scenario(fly: Cluster) -> None:
    c = fly
    app = await call(c, "POST", "/v1/apps", 201, "App", json={"app_name": "flyish"})
    assert app["name"] == "flyish"
    listed = await call(c, "GET", "/v1/apps", definition="ListAppsResponse")
    assert "flyish" in [a["name"] for a in listed["apps"]] and listed["total_apps"] == 2
    await call(c, "GET", A, definition="App")

    config = {
        "init": {"exec": [sys.executable, "-c", PICKY]},
        "size": "shared-cpu-2x",
        "services": [
            {
                "internal_port": 8080,
                "protocol": "tcp",
                "ports": [
                    {"port": 443, "handlers": ["tls", "http"]},
                    {"port": 80, "force_https": True},
                ],
                "autostop": True,
                "checks": [
                    {
                        "type": "http",
                        "method": "HEAD",
                        "path": "/",
                        "headers": [{"name": "X-Souk-Check", "values": ["yes"]}],
                        "interval": "30s",
                    }
                ],
            }
        ],
        "checks": {
            "picky": {
                "type": "http",
                "port": 8080,
                "method": "head",
                "path": "/",
                "headers": [{"name": "X-Souk-Check", "values": ["yes"]}],
                "interval": "30s",
                "timeout": "2s",
            },
            "plain": {"type": "http", "port": 8080, "path": "/", "interval": "30s"},
        },
        "metrics": {"port": 9091, "path": "/metrics"},
        "restart": {"policy": "on-failure", "max_retries": 3},
        "stop_config": {"signal": "SIGTERM", "timeout": "3s"},
        "auto_destroy": False,
        "metadata": {"team": "a"},
        "dns": {"skip_registration": True},
        "disable_machine_autostart": False,
    }
    # no region: the market picks it; ams cannot hold 2 cpus beside anything, mad can
    created = await call(
        c, "POST", M, definition="Machine", json={"config": config, "lease_ttl": 30}
    )
    mid = created["id"]
    assert "image" not in created["config"] and "image_ref" not in created
    assert isinstance(created["nonce"], str)
    assert created["config"]["guest"] == {"cpu_kind": "shared", "cpus": 2, "memory_mb": 512}
    assert created["config"]["services"][0]["autostop"] == "stop"
    assert created["config"]["services"][0]["ports"][1]["force_https"] is True
    assert created["config"]["metrics"] == {"port": 9091, "path": "/metrics", "https": False}
    assert created["config"]["stop_config"]["timeout"] == "3s"
    nonce = {"fly-machine-lease-nonce": created["nonce"]}
    await call(c, "GET", f"{M}/{mid}/lease", definition="Lease")
    await call(c, "DELETE", f"{M}/{mid}/lease", headers=nonce)

    await call(c, "GET", f"{M}/{mid}/wait", params={"state": "started", "timeout": "30"})
    machine = await until(
        c,
        mid,
        lambda m: (
            {k["name"]: k["status"] for k in m.get("checks", [])}
            == {"picky": "passing", "plain": "critical", "servicecheck-00-http-8080": "passing"}
        ),
    )
    checks = {k["name"]: k["status"] for k in machine["checks"]}
    assert checks == {
        "picky": "passing",
        "plain": "critical",
        "servicecheck-00-http-8080": "passing",
    }, machine["checks"]
    for unwanted in ("nonce", "private_ip") if machine.get("private_ip") is None else ("nonce",):
        assert unwanted not in machine
    assert (
        "cmd" not in machine["config"]["init"]
        and "concurrency" not in machine["config"]["services"][0]
    )

    await call(c, "GET", M, definition="Machine", array=True)
    await call(c, "GET", f"{M}/{mid}/metadata")
    await call(c, "POST", f"{M}/{mid}/metadata/owner", 204, json={"value": "me"})
    await call(c, "DELETE", f"{M}/{mid}/metadata/owner", 204)
    await call(c, "POST", f"{M}/{mid}/lease", definition="Lease", json={"ttl": 10})
    lease = await call(c, "GET", f"{M}/{mid}/lease", definition="Lease")
    held = {"fly-machine-lease-nonce": lease["nonce"]}
    await call(c, "DELETE", f"{M}/{mid}/lease", headers=held)
    await call(c, "POST", f"{M}/{mid}/cordon")
    await call(c, "POST", f"{M}/{mid}/uncordon")

    body = await call(c, "DELETE", f"{M}/{mid}", 412)  # as Fly: a running machine needs force
    assert body["code"] == "failed_precondition" and body["status"] == "unknown"
    await call(c, "POST", f"{M}/{mid}/stop", definition="Machine", json={"timeout": "2s"})
    await call(c, "GET", f"{M}/{mid}/wait", params={"state": "stopped", "timeout": "30"})
    await call(c, "POST", f"{M}/{mid}/start", definition="Machine")
    await call(c, "GET", f"{M}/{mid}/wait", params={"state": "started", "timeout": "30"})
    await call(c, "POST", f"{M}/{mid}/suspend", definition="Machine")
    await call(c, "GET", f"{M}/{mid}/wait", params={"state": "suspended", "timeout": "30"})
    await call(c, "POST", f"{M}/{mid}/start", definition="Machine")
    await call(c, "GET", f"{M}/{mid}/wait", params={"state": "started", "timeout": "30"})
    await call(c, "POST", f"{M}/{mid}/restart", definition="Machine")
    update = {"config": {**config, "env": {"V": "2"}}}
    put = await call(c, "PUT", f"{M}/{mid}", definition="Machine", json=update)
    assert put["config"]["env"] == {"V": "2"}
    update["config"]["env"] = {"V": "3"}
    posted = await call(c, "POST", f"{M}/{mid}", definition="Machine", json=update)
    assert posted["instance_id"] != put["instance_id"]
    events = await call(c, "GET", f"{M}/{mid}/events", definition="MachineEvent", array=True)
    assert {"launch", "start", "stop", "restart", "update"} <= {e["type"] for e in events}
    await call(c, "DELETE", f"{M}/{mid}", params={"force": "true"})
    await call(c, "GET", f"{M}/{mid}/wait", params={"state": "destroyed", "timeout": "30"})


async def test_exit_events_and_errors_in_flys_shape(fly: Cluster) -> None:
    c = fly
    await call(c, "POST", "/v1/apps", 201, "App", json={"name": "flyish"})
    config = {"init": {"exec": ["sh", "-c", "exit 3"]}, "restart": {"policy": "no"}}
    m = await call(c, "POST", M, definition="Machine", json={"region": "ams", "config": config})
    await call(c, "GET", f"{M}/{m['id']}/wait", params={"state": "stopped", "timeout": "30"})
    events = await call(c, "GET", f"{M}/{m['id']}/events", definition="MachineEvent", array=True)
    exits = [e for e in events if e["type"] == "exit"]
    assert exits and exits[0]["request"]["exit_event"]["exit_code"] == 3, events
    assert all(isinstance(e["id"], str) for e in events)

    body = await call(c, "GET", f"{M}/nosuchmachine", 404)
    assert (body["status"], body["code"]) == ("unknown", "not_found")
    body = await call(c, "POST", M, 400, json={"region": "iad", "config": config})
    assert body["details"]["regions"] == ["ams", "mad"]
    huge = {**config, "guest": {"cpus": 64, "memory_mb": 1024}}
    body = await call(c, "POST", M, 412, json={"region": "mad", "config": huge})
    assert body["status"] == "insufficient_capacity"
    containers = {**config, "containers": [{"name": "a", "image": "x"}]}
    body = await call(c, "POST", M, 400, json={"region": "mad", "config": containers})
    assert body["error"].startswith("config.containers") and body["code"] == "unsupported"
    await call(c, "DELETE", f"{M}/{m['id']}")  # stopped: no force needed


async def test_processes_each_with_their_own_command_env_and_user(
    fly: Cluster,
) -> None:
    c = fly
    await call(c, "POST", "/v1/apps", 201, "App", json={"name": "flyish"})
    write = 'echo "$WHO $(id -u) $WHERE"'
    config = {
        "init": {"exec": ["sleep", "600"]},  # the default command: process a uses it
        "env": {"SHARED": "1"},
        "restart": {"policy": "no"},
        "processes": [
            {
                "cmd": ["sh", "-c", f"{write}; exec sleep 600"],
                "entrypoint": [],
                "env": {"WHO": "a"},
                "env_from": [{"env_var": "WHERE", "field_ref": "region"}],
            },
            {"exec": ["sh", "-c", f"{write}; sleep 1; exit 4"], "env": {"WHO": "b"}, "user": "7"},
        ],
    }
    m = await call(c, "POST", M, definition="Machine", json={"region": "mad", "config": config})
    await call(c, "GET", f"{M}/{m['id']}/wait", params={"state": "stopped", "timeout": "30"})
    logs = await (await c.call("GET", f"{M}/{m['id']}/logs", params={"stream": "stdout"})).text()
    outputs = {line.split()[0]: line.split() for line in logs.splitlines() if line.strip()}
    a, b = outputs["a"], outputs["b"]
    assert (a[0], a[2], b[0]) == ("a", "mad", "b"), outputs
    assert int(b[1]) == int(a[1]) + 7 or (int(a[1]) != 0 and b[1] == a[1])  # ids only as root
    events = await call(c, "GET", f"{M}/{m['id']}/events", definition="MachineEvent", array=True)
    exits = [e for e in events if e["type"] == "exit"]
    assert exits[0]["request"]["exit_event"]["exit_code"] == 4, exits  # the first one to end
    await call(c, "DELETE", f"{M}/{m['id']}")
