"""A machine of one app binding another app's stopped machine's address and port (host commands
of a worker that is not root share the host's loopback) is never sent that app's requests: the
proxy checks, for each connection it opens, that the socket it reached is held by the machine's
own processes. On the private network (a root worker) the address is in no other machine's
network namespace: the thief cannot bind it at all."""

from __future__ import annotations

import sys
import time
from pathlib import Path
from typing import Any

import pytest

from souk import listeners
from souk.clients.workers import WorkerClient
from souk.proxy.wake import port_open
from tests.support.hello import PORT, hello_config
from tests.support.local_cluster import local_cluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

# Listens at TAKE (host:port), records every request but its own `/__seen`, which answers them.
THIEF = """
import json, os
from http.server import BaseHTTPRequestHandler, HTTPServer
seen = []
class Thief(BaseHTTPRequestHandler):
    def do_GET(self):
        if self.path != "/__seen":
            seen.append({"path": self.path, "headers": dict(self.headers)})
        body = json.dumps(seen).encode()
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)
host, port = os.environ["TAKE"].rsplit(":", 1)
HTTPServer((host, int(port)), Thief).serve_forever()
"""


def thief_config(take: str) -> dict[str, Any]:
    return {
        "init": {"exec": [sys.executable, "-c", THIEF]},
        "env": {"TAKE": take},
        "restart": {"policy": "no"},
    }


async def test_a_machine_bound_to_another_apps_address_gets_none_of_its_requests(
    tmp_path: Path,
) -> None:
    async with local_cluster(tmp_path, [("mad1", "mad")], ["alpha", "beta"]) as c:
        a = await c.create("alpha", "mad", hello_config(autostop=False))
        await c.serving("alpha", a)
        status, headers, _ = await c.get("alpha")  # its own socket: checked, and sent to
        assert status == 200 and headers["souk-machine"] == a["id"]
        assert c.proxy.forwarder.stats.get("foreign_listener", 0) == 0

        await c.api("POST", f"/v1/apps/alpha/machines/{a['id']}/stop", json={})
        await c.wait("alpha", a["id"], "stopped")
        await eventually(lambda: c.seen(a["id"], "stopped"))
        take = f"{a['private_ip']}:{PORT}"
        b = await c.create("beta", "mad", thief_config(take))
        await c.wait("beta", b["id"], "started")
        if ":" in a["private_ip"]:  # on the private network: not its namespace's address
            await c.wait("beta", b["id"], "stopped")
            assert not await port_open(a["private_ip"], PORT, time.monotonic() + 0.5)
            return
        assert await port_open(a["private_ip"], PORT, time.monotonic() + 10)

        secret = {"souk-app": "alpha", "Authorization": "Bearer alpha-secret", "Cookie": "s=1"}
        async with c.http.get(c.proxy_url + "/account", headers=secret) as resp:
            status, body = resp.status, await resp.json(content_type=None)
        async with c.http.get(f"http://{take}/__seen") as resp:
            assert await resp.json(content_type=None) == []  # the thief heard nothing
        assert status == 502 and body["code"] == "foreign_listener", body
        assert a["id"] in body["error"]
        assert c.proxy.forwarder.stats["foreign_listener"] >= 1

        # The worker's answers the proxy went by: the socket is beta's machine's, not alpha's.
        (taker,) = listeners.takers(a["private_ip"], PORT)
        worker = c.workers["mad1"].url
        async with WorkerClient() as workers:
            assert await workers.holds_socket("mad1", worker, b["id"], taker.inode)
            assert not await workers.holds_socket("mad1", worker, a["id"], taker.inode)
        async with c.http.get(f"{worker}/v1/machines/{b['id']}/sockets/x1") as resp:
            assert resp.status == 400 and (await resp.json())["code"] == "invalid"
