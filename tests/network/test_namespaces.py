"""Each process machine in a network namespace of its own, on its app's private network."""

from __future__ import annotations

import asyncio
import ipaddress
import os
import sys
from typing import Any

import aiohttp
import pytest

from souk.worker.machines.addresses import DEFAULT_PREFIX
from souk.worker.oci import network
from tests.support.clients import Client

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")

# Answers its machine id on every address of its namespace, port 8080 ([::] takes IPv4 too).
SERVE = """
import http.server, os, socket
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ["SOUK_MACHINE_ID"].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
class S(http.server.HTTPServer):
    address_family = socket.AF_INET6
S(("::", 8080), H).serve_forever()
"""


def server(app: str = "demo") -> dict[str, Any]:
    return {"app": app, "config": {"init": {"exec": [sys.executable, "-c", SERVE]}}}


async def answer(address: str, port: int = 8080, timeout: float = 15) -> str:
    """What the server at address:port says, once it listens."""
    deadline = asyncio.get_running_loop().time() + timeout
    async with aiohttp.ClientSession() as http:
        while True:
            try:
                async with http.get(f"http://[{address}]:{port}/") as resp:
                    return await resp.text()
            except aiohttp.ClientConnectionError:
                if asyncio.get_running_loop().time() > deadline:
                    raise
                await asyncio.sleep(0.05)


async def test_two_machines_of_one_app_both_listen_on_one_port(client: Client) -> None:
    made = []
    for _ in range(2):
        resp = await client.post("/v1/machines", json=server())
        assert resp.status == 201, await resp.text()
        made.append(await resp.json())
    first, second = made
    for m in made:
        ip = ipaddress.ip_address(m["private_ip"])
        assert ip in ipaddress.ip_network(DEFAULT_PREFIX), m["private_ip"]
    # one app on one worker: one network and one worker prefix, two addresses
    assert first["private_ip"] != second["private_ip"]
    assert first["private_ip"].rsplit(":", 2)[0] == second["private_ip"].rsplit(":", 2)[0]
    for m in made:
        await client.get(f"/v1/machines/{m['id']}/wait", params={"state": "started"})
    # both bound [::]:8080, each in its own namespace: each answers at its own address
    assert await answer(first["private_ip"]) == first["id"]
    assert await answer(second["private_ip"]) == second["id"]


async def test_the_namespace_goes_with_the_machine(client: Client) -> None:
    resp = await client.post("/v1/machines", json=server())
    m = await resp.json()
    await client.get(f"/v1/machines/{m['id']}/wait", params={"state": "started"})
    netns, veth = network.names(m["id"])
    assert (network.NETNS_DIR / netns).exists()
    # the machine's process is in it, not in the host's
    inside = os.stat(network.NETNS_DIR / netns).st_ino
    ps = await (await client.get(f"/v1/machines/{m['id']}/ps")).json()
    assert ps
    assert {os.stat(f"/proc/{p['pid']}/ns/net").st_ino for p in ps} == {inside}
    await client.post(f"/v1/machines/{m['id']}/stop", json={"timeout": "2s"})
    await client.get(f"/v1/machines/{m['id']}/wait", params={"state": "stopped"})
    await client.delete(f"/v1/machines/{m['id']}")
    await client.get(f"/v1/machines/{m['id']}/wait", params={"state": "destroyed"})
    assert not (network.NETNS_DIR / netns).exists()
    assert not network._conf(veth).exists()


async def test_an_exec_runs_in_the_machines_network_and_sees_its_resolver(client: Client) -> None:
    resp = await client.post("/v1/machines", json=server())
    m = await resp.json()
    await client.get(f"/v1/machines/{m['id']}/wait", params={"state": "started"})
    script = "cat /proc/self/net/if_inet6; echo --; cat /etc/resolv.conf"
    resp = await client.post(f"/v1/machines/{m['id']}/exec", json={"command": ["sh", "-c", script]})
    assert resp.status == 200, await resp.text()
    out = (await resp.json())["stdout"]
    addresses, resolv = out.split("--")
    packed = ipaddress.ip_address(m["private_ip"]).packed.hex()
    assert packed in addresses and "eth0" in addresses
    assert f"nameserver {network.resolver(m['private_ip'])}" in resolv
    # the host's resolv.conf is untouched
    with open("/etc/resolv.conf") as host:
        assert network.resolver(m["private_ip"]) not in host.read()
