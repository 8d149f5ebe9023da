"""A vm guest on the private network, on a host of its own: run as `python -m
tests.worker.drivers.vm.private_network DIR` in a network namespace of its own (`test_vm_network.py`
starts it under `unshare -n`), it makes the host as `tests/network/one_host.py` does (forwarding,
a LAN address, an "internet" beside it), a registry with a busybox image, a real worker with
the vm driver, its DNS and its API, and machines of two apps on two networks: a guest of `alpha`
and process machines of `alpha` and `beta`. It probes from inside the guest what it reaches and
who reaches it, and prints what it saw as JSON. Nothing it makes outlives it."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import socket
import subprocess
import sys
from dataclasses import replace
from pathlib import Path
from typing import Any

from aiohttp import web

from souk.catalog.bus import InProcessBus
from souk.models.machine import CreateMachine, Machine
from souk.models.machine_ops import ExecRequest
from souk.worker import names
from souk.worker.daemon import make_app, make_driver, publishing, running
from souk.worker.engine import Engine
from souk.worker.oci import network
from tests.network.one_host import (
    API_PORT,
    LAN4,
    LAN6,
    OUTSIDE,
    REACH,
    SERVE,
    WEB_PORT,
    make_host,
    peer_seen_by_outside,
    until_serving,
)
from tests.support.engines import destroy_all, settings
from tests.support.images import ImageSpec, busybox_layer, layer
from tests.support.registry import Registry, push, running_registry

BOOT = 400.0  # a guest under TCG on a busy host

# `probe HOST PORT`: the body an HTTP GET gets, or "refused", or "dropped" (no answer within
# the timeout). busybox's nc, not its wget: a static glibc busybox crashes looking a service
# name up, and resolves no name (the host's NSS modules are not in the image), so a name is
# asked of the resolver by busybox's own nslookup first (an address other than the asker's).
PROBE = """
host=$1
case $host in *.internal)
  host=$(nslookup -type=AAAA "$host" | sed -n 's/^Address: //p' |
         grep -vx "$SOUK_PRIVATE_IP" | head -n 1);;  # another machine than this one
esac
out=$(printf 'GET / HTTP/1.0\\r\\n\\r\\n' | nc -w 4 "$host" "$2" 2>/tmp/probe.err)
if [ -n "$out" ]; then printf '%s\\n' "$out" | tail -n 1  # the body: one line
elif grep -q refused /tmp/probe.err; then echo refused
elif grep -q "timed out" /tmp/probe.err; then echo dropped
elif [ -s /tmp/probe.err ]; then echo "failed: $(cat /tmp/probe.err)"
else echo dropped; fi
"""


async def guest_image(registry: Registry) -> str:
    """A busybox image whose httpd answers on 8080, in the registry: its reference."""
    tar = busybox_layer().file("www/index.html", b"a guest\n")
    for applet in ("nc", "nslookup", "grep", "sed", "head", "tail", "hostname", "ip"):
        tar.symlink(f"bin/{applet}", "busybox")
    spec = ImageSpec([layer(tar.bytes())], cmd=["httpd", "-f", "-p", "8080", "-h", "/www"])
    async with registry.client() as client:
        await push(client, registry, "guest:1", spec)
    return f"{registry.host}/guest:1"


async def run(e: Engine, machine: str, *argv: str) -> str:
    result = await e.exec(machine, ExecRequest(command=list(argv), timeout=30))
    return (result.stdout or "").strip() or (result.stderr or "").strip()


async def probe(e: Engine, guest: str, host: str, port: int) -> str:
    return await run(e, guest, "sh", "-c", PROBE, "probe", host, str(port))


async def reach(e: Engine, machine: str, host: str, port: int, body: bool = False) -> str:
    """From a process machine (one_host's REACH)."""
    argv = [sys.executable, "-c", REACH, host, str(port), *(["body"] if body else [])]
    return await run(e, machine, *argv)


async def scenario(tmp: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    bus = InProcessBus()
    with running_registry(tmp / "registry", access_log=False) as registry:
        image = await guest_image(registry)
        s = replace(settings(tmp), insecure_registries=(registry.host,))
        async with (
            running(Engine(s, make_driver("vm", s))) as e,
            publishing(e, bus),
            names.answering(e.settings, bus) as answering,
        ):
            assert answering is not None
            await answering
            runner = web.AppRunner(make_app(e))
            await runner.setup()
            for host in ("::", "0.0.0.0"):
                await web.TCPSite(runner, host, API_PORT).start()
            try:
                await machines(e, image, seen)
            finally:
                await runner.cleanup()
                await destroy_all(e)
    return seen


async def machines(e: Engine, image: str, seen: dict[str, Any]) -> None:
    made: dict[str, Machine] = {}
    for name, app, net in (("a2", "alpha", None), ("b1", "beta", "personal/other")):
        req = {"app": app, "config": {"init": {"exec": [sys.executable, "-c", SERVE]}}}
        made[name] = await e.create(CreateMachine.model_validate({**req, "network": net}))
    vm_req = {"app": "alpha", "config": {"image": image, "guest": {"memory_mb": 256}}}
    made["vm"] = await e.create(CreateMachine.model_validate(vm_req))
    for name, m in made.items():
        ok, found = await e.wait(m.id, "started", BOOT if name == "vm" else 15, None)
        assert ok, (name, found.state, (e.settings.rundir(m.id) / "console.log").read_text())
        assert m.private_ip is not None
        await until_serving(e, name, m.private_ip)
    vm, a2, b1 = made["vm"].id, made["a2"], made["b1"]
    assert a2.private_ip and b1.private_ip
    at = {name: m.private_ip for name, m in made.items()}
    seen["ids"] = {name: m.id for name, m in made.items()}
    seen["addresses"] = at
    # what the guest holds: its machine's private address, its resolver, its name
    seen["guest_addresses"] = await run(e, vm, "cat", "/proc/net/if_inet6")
    seen["resolv_conf"] = await run(e, vm, "cat", "/etc/resolv.conf")
    seen["resolver"] = network.resolver(a2.private_ip)
    seen["hostname"] = await run(e, vm, "hostname")
    seen["by_address"] = await probe(e, vm, a2.private_ip, 8080)
    seen["names"] = await run(e, vm, "nslookup", "-type=AAAA", "alpha.internal")
    seen["by_name"] = await probe(e, vm, f"{a2.id}.vm.alpha.internal", 8080)
    seen["by_app_name"] = await probe(e, vm, "alpha.internal", 8080)
    seen["back"] = await reach(e, a2.id, at["vm"] or "", 8080, body=True)
    seen["to_other_network"] = await probe(e, vm, b1.private_ip, 8080)
    seen["from_other_network"] = await reach(e, b1.id, at["vm"] or "", 8080)
    resolver = network.resolver(a2.private_ip)
    seen["host"] = {
        where: await probe(e, vm, host, API_PORT)
        for where, host in (
            ("gateway", network.GATEWAY),
            ("lan4", LAN4),
            ("lan6", LAN6),
            ("resolver", resolver),
        )
    }
    for host in (LAN4, LAN6):  # the API does listen: the host itself reaches it
        with socket.create_connection((host, API_PORT), timeout=2):
            seen.setdefault("api_from_host", []).append("open")
    listener = peer_seen_by_outside((Path(sys.argv[1]) / "outside").read_text())
    await probe(e, vm, OUTSIDE, WEB_PORT)  # what the other end saw is what counts
    try:
        out, _ = listener.communicate(timeout=5)
    except subprocess.TimeoutExpired:
        listener.kill()
        out, _ = listener.communicate()
    seen["internet_saw"] = out.strip()
    # last, as it changes the guest's routes: its kernel is its own, so it may send from any
    # address it likes. The host routes that address back to it (as if it were its own), so
    # that nothing but the host's rule on sources stands in its way: the host drops what does
    # not come from the machine's own address
    spoofed = str(ipaddress.IPv6Address(at["vm"] or "") + 1)
    veth = network.names(vm)[1]
    back = ["ip", "-6", "route", "add", f"{spoofed}/128", "dev", veth]
    await asyncio.to_thread(subprocess.run, back, check=True)
    await run(e, vm, "ip", "-6", "addr", "add", f"{spoofed}/128", "dev", "eth0")
    route = ["ip", "-6", "route", "replace", "default", "via", network.GATEWAY6, "dev", "eth0"]
    await run(e, vm, *route, "metric", "1", "src", spoofed)
    seen["spoofed"] = await probe(e, vm, a2.private_ip, 8080)


def main() -> None:
    tmp = Path(sys.argv[1])
    outside = f"skv{os.getpid()}-out"
    (tmp / "outside").write_text(outside)
    try:
        make_host(outside)
        print(json.dumps(asyncio.run(scenario(tmp))))
    finally:
        subprocess.run(["ip", "netns", "del", outside], capture_output=True, check=False)


if __name__ == "__main__":
    main()
