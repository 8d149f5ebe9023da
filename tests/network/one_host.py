"""A host of its own for the private network's tests: run as `python -m tests.network.one_host
DIR` in a network namespace of its own (`test_isolation.py` starts it under `unshare -n`), it
makes the host (forwarding on, a LAN address, a nats-server, the "internet" in a namespace
beside it), runs a real worker with machines of two apps on two networks, probes from inside
the machines what each reaches, and prints what it saw as JSON. Nothing it makes outlives it."""

from __future__ import annotations

import asyncio
import ipaddress
import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from aiohttp import web

from souk.catalog.bus import InProcessBus
from souk.models.machine import CreateMachine, Machine
from souk.models.machine_ops import ExecRequest
from souk.worker import names
from souk.worker.daemon import make_app, publishing
from souk.worker.engine import Engine
from souk.worker.oci import network
from tests.support.engines import engine as started_engine

LAN4, LAN6 = "10.99.0.1", "fd99::1"  # the host's own addresses on its LAN
OUTSIDE = "198.51.100.2"  # the internet, in a namespace beside the host
API_PORT, NATS_PORT, WEB_PORT = 7100, 4222, 8000

SERVE = """
import http.server, os, socket
class H(http.server.BaseHTTPRequestHandler):
    def do_GET(self):
        body = os.environ["SOUK_MACHINE_ID"].encode()
        self.send_response(200); self.send_header("Content-Length", str(len(body)))
        self.end_headers(); self.wfile.write(body)
    def log_message(self, *a): pass
class S(http.server.HTTPServer):
    address_family = socket.AF_INET6
    def server_bind(self):
        import socketserver; socketserver.TCPServer.server_bind(self)
S(("::", 8080), H).serve_forever()
"""

# `reach HOST PORT`: "open", "refused" or "dropped" (no answer within the timeout); with a
# path, the body an HTTP GET gets.
REACH = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
import ipaddress
try:
    family = socket.AF_INET if ipaddress.ip_address(host).version == 4 else socket.AF_INET6
except ValueError:  # a name: its AAAA
    family = socket.AF_INET6
s = socket.socket(family, socket.SOCK_STREAM)
s.settimeout(10 if len(sys.argv) > 3 else 0.5)  # a body is asked only where it must answer
try:
    s.connect(socket.getaddrinfo(host, port, family, socket.SOCK_STREAM)[0][4])
except ConnectionRefusedError:
    print("refused"); sys.exit()
except socket.gaierror as exc:
    print(f"unresolved: {exc}"); sys.exit()
except OSError:
    print("dropped"); sys.exit()
if len(sys.argv) > 3:
    s.sendall(b"GET / HTTP/1.0\\r\\n\\r\\n"); data = b""
    while chunk := s.recv(4096):
        data += chunk
    print(data.split(b"\\r\\n\\r\\n", 1)[-1].decode())
else:
    print("open")
"""


# `listen HOST PORT`: "ready", then the words of the datagrams HOST:PORT got, sorted, once
# none came for a second.
LISTEN = """
import socket, sys
family = socket.AF_INET6 if ":" in sys.argv[1] else socket.AF_INET
s = socket.socket(family, socket.SOCK_DGRAM)
s.bind((sys.argv[1], int(sys.argv[2]))); s.settimeout(1); print("ready", flush=True)
got = []
try:
    while True:
        got.append(s.recv(100).decode())
except TimeoutError:
    pass
print(" ".join(sorted(got)) or "nothing", flush=True)
"""

# `send HOST PORT SOURCE WORD [SOURCE WORD]...`: each WORD a datagram to HOST:PORT from SOURCE,
# an address of the sender's own interfaces.
SEND = """
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
family = socket.AF_INET6 if ":" in host else socket.AF_INET
for source, word in zip(sys.argv[3::2], sys.argv[4::2]):
    with socket.socket(family, socket.SOCK_DGRAM) as s:
        s.bind((source, 0)); s.sendto(word.encode(), (host, port))
"""
SPOOF_PORT = 9000


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def make_host(outside: str) -> None:
    sh("ip", "link", "set", "lo", "up")
    for knob in ("net/ipv4/ip_forward", "net/ipv6/conf/all/forwarding"):
        Path("/proc/sys", knob).write_text("1")
    sh("ip", "link", "add", "lan0", "type", "veth", "peer", "name", "lan1")  # no dummy module
    sh("ip", "addr", "add", f"{LAN4}/24", "dev", "lan0")
    sh("ip", "-6", "addr", "add", f"{LAN6}/64", "dev", "lan0", "nodad")
    sh("ip", "link", "set", "lan1", "up")
    sh("ip", "link", "set", "lan0", "up")
    sh("ip", "netns", "add", outside)
    sh("ip", "link", "add", "wan0", "type", "veth", "peer", "name", "eth0", "netns", outside)
    sh("ip", "addr", "add", "198.51.100.1/24", "dev", "wan0")
    sh("ip", "link", "set", "wan0", "up")
    sh("ip", "-n", outside, "addr", "add", f"{OUTSIDE}/24", "dev", "eth0")
    sh("ip", "-n", outside, "link", "set", "eth0", "up")
    sh("ip", "route", "add", "default", "via", OUTSIDE)


def peer_seen_by_outside(outside: str) -> subprocess.Popen[str]:
    """A server on the internet that prints the address of whoever connects to it."""
    code = (
        "import socket; s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, 2, 1);"
        f"s.bind(('{OUTSIDE}', {WEB_PORT})); s.listen(); print('ready', flush=True);"
        "c, a = s.accept(); print(a[0], flush=True)"
    )
    proc = subprocess.Popen(
        ["ip", "netns", "exec", outside, sys.executable, "-c", code],
        stdout=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    return proc


# `ask NAME`: the addresses the machine's own resolver (its resolv.conf) gives for NAME, or
# "nxdomain"; `ask _apps.internal` the TXT record, asked of the resolver resolv.conf names.
ASK = """
import socket, sys
name = sys.argv[1]
if name.startswith("_apps"):
    from dnslib import DNSRecord
    server = open("/etc/resolv.conf").read().split()[1]
    answer = DNSRecord.parse(DNSRecord.question(name, "TXT").send(server, 53, ipv6=True, timeout=2))
    print(",".join(str(rr.rdata).strip('"') for rr in answer.rr)); sys.exit()
try:
    found = socket.getaddrinfo(name, 8080, socket.AF_INET6, socket.SOCK_STREAM)
except socket.gaierror:
    print("nxdomain"); sys.exit()
print(" ".join(sorted({f[4][0] for f in found})))
"""


# `ask_tcp NAME`: the AAAA answers for NAME from the machine's resolver, asked over TCP.
ASK_TCP = """
import sys
from dnslib import DNSRecord
server = open("/etc/resolv.conf").read().split()[1]
question = DNSRecord.question(sys.argv[1], "AAAA")
answer = DNSRecord.parse(question.send(server, 53, tcp=True, ipv6=True, timeout=5))
print(" ".join(sorted(str(rr.rdata) for rr in answer.rr)) or "none")
"""


async def ask(e: Engine, machine: str, name: str, script: str = ASK) -> list[str]:
    result = await e.exec(machine, ExecRequest(command=[sys.executable, "-c", script, name]))
    return (result.stdout or result.stderr).split()


async def until_gone(e: Engine, machine: str, name: str, address: str) -> float:
    """Seconds from now until `name` no longer gives `address` to `machine`."""
    started = time.monotonic()
    while address in await ask(e, machine, name):
        if time.monotonic() - started > 10:
            raise AssertionError(f"{name} still gives {address}")
    return time.monotonic() - started


async def reach(e: Engine, machine: str, host: str, port: int, body: bool = False) -> str:
    argv = [sys.executable, "-c", REACH, host, str(port), *(["body"] if body else [])]
    result = await e.exec(machine, ExecRequest(command=argv, timeout=10))
    return (result.stdout or "").strip() or (result.stderr or "").strip()


async def until_serving(e: Engine, machine: str, address: str) -> None:
    deadline = time.monotonic() + 15
    while time.monotonic() < deadline:
        with socket.socket(socket.AF_INET6) as s:
            s.settimeout(0.5)
            if s.connect_ex((address, 8080)) == 0:
                return
        await asyncio.sleep(0.05)
    raise AssertionError(f"{machine} never listened")


def spoofed(sender: str, receiver: str, host: str, own: str, other: str) -> str:
    """What `host`, listening in the namespace `receiver`, gets of a datagram sent from `own`
    (the sender's address) and one from `other`: an address the root of the namespace
    `sender` (a machine's) gives its eth0, as a machine with the capability (or a vm's guest
    kernel) could, since nothing of its own namespace stops it."""
    listener = subprocess.Popen(
        ["ip", "netns", "exec", receiver, sys.executable, "-c", LISTEN, host, str(SPOOF_PORT)],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert listener.stdout is not None and listener.stdout.readline().strip() == "ready"
        sh("ip", "-n", sender, "addr", "add", other, "dev", "eth0", *(["nodad"] * (":" in other)))
        try:
            sh(
                *("ip", "netns", "exec", sender, sys.executable, "-c", SEND, host),
                *(str(SPOOF_PORT), own, "own", other, "spoofed"),
            )
        finally:  # not a source the machine's own connections could pick after
            sh("ip", "-n", sender, "addr", "del", other, "dev", "eth0")
        out, _ = listener.communicate(timeout=10)
    finally:
        if listener.poll() is None:
            listener.kill()
            listener.wait()
    return out.strip()


async def spoofs_seen(made: dict[str, Machine], outside: str, seen: dict[str, Any]) -> None:
    """a1 sends from addresses of its host's not its own: b1's IPv4 (to the internet, where
    the host masquerades it) and a free address of its own network (to a2)."""
    a1, a2, b1 = made["a1"], made["a2"], made["b1"]
    assert a1.private_ip and a2.private_ip
    a1_4, b1_4 = network.egress(a1.id), network.egress(b1.id)
    assert a1_4 and b1_4 and a1_4 != b1_4
    free6 = str(ipaddress.IPv6Address(a1.private_ip) + 0x5A5A)
    assert free6 not in {m.private_ip for m in made.values()}
    ns1, ns2 = network.names(a1.id)[0], network.names(a2.id)[0]
    seen["spoofed"] = {
        "ipv4_to_internet": await asyncio.to_thread(spoofed, ns1, outside, OUTSIDE, a1_4, b1_4),
        "ipv6_to_machine": await asyncio.to_thread(
            spoofed, ns1, ns2, a2.private_ip, a1.private_ip, free6
        ),
    }


async def scenario(tmp: Path) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    bus = InProcessBus()
    async with (
        started_engine(tmp, "process") as e,
        publishing(e, bus),
        names.answering(e.settings, bus) as answering,
    ):
        assert answering is not None
        await answering  # the DNS answers from a caught-up replica
        runner = web.AppRunner(make_app(e))
        await runner.setup()
        await web.TCPSite(runner, "::", API_PORT).start()
        try:
            made = {}
            for name, app, net in (
                ("a1", "alpha", None),
                ("a2", "alpha", None),
                ("b1", "beta", "personal/other"),
            ):
                req = {"app": app, "config": {"init": {"exec": [sys.executable, "-c", SERVE]}}}
                m = await e.create(CreateMachine.model_validate({**req, "network": net}))
                made[name] = m
            for name, m in made.items():
                await e.wait(m.id, "started", 15, None)
                assert m.private_ip is not None
                await until_serving(e, name, m.private_ip)
            a1, a2, b1 = made["a1"], made["a2"], made["b1"]
            assert a1.private_ip and a2.private_ip and b1.private_ip
            seen["ids"] = {name: m.id for name, m in made.items()}
            seen["same_network"] = await reach(e, a1.id, a2.private_ip, 8080, body=True)
            seen["to_other_network"] = await reach(e, a1.id, b1.private_ip, 8080)
            seen["from_other_network"] = await reach(e, b1.id, a1.private_ip, 8080)
            resolver = network.resolver(a1.private_ip)
            host_services = {
                "worker_api_gateway": (network.GATEWAY, API_PORT),
                "worker_api_lan4": (LAN4, API_PORT),
                "worker_api_lan6": (LAN6, API_PORT),
                "worker_api_resolver": (resolver, API_PORT),
                "nats_lan4": (LAN4, NATS_PORT),
                "nats_lan6": (LAN6, NATS_PORT),
                "nats_gateway": (network.GATEWAY, NATS_PORT),
            }
            seen["host"] = {
                what: await reach(e, a1.id, host, port)
                for what, (host, port) in host_services.items()
            }
            # the host itself (as its proxy does) reaches the machine
            with socket.create_connection((a1.private_ip, 8080), timeout=2):
                seen["host_to_machine"] = "open"
            listener = peer_seen_by_outside((tmp / "outside").read_text())
            seen["internet"] = await reach(e, a1.id, OUTSIDE, WEB_PORT)
            await spoofs_seen(made, (tmp / "outside").read_text(), seen)
            await names_seen(e, made, seen)
            try:
                out, _ = listener.communicate(timeout=2)
            except subprocess.TimeoutExpired:
                listener.kill()
                out, _ = listener.communicate()
            seen["internet_saw"] = out.strip()
        finally:
            await runner.cleanup()
    return seen


async def names_seen(e: Engine, made: dict[str, Machine], seen: dict[str, Any]) -> None:
    a1, a2, b1 = made["a1"], made["a2"], made["b1"]
    seen["names"] = {
        "alpha": await ask(e, a1.id, "alpha.internal"),
        "region": await ask(e, a1.id, f"{e.settings.region}.alpha.internal"),
        "other_region": await ask(e, a1.id, "ams.alpha.internal"),
        "vm": await ask(e, a1.id, f"{a2.id}.vm.alpha.internal"),
        "top1": await ask(e, a1.id, "top1.nearest.of.alpha.internal"),
        "apps": await ask(e, a1.id, "_apps.internal"),
        "beta_from_alpha": await ask(e, a1.id, "beta.internal"),
        "alpha_from_beta": await ask(e, b1.id, "alpha.internal"),
        "nothing": await ask(e, a1.id, "nothing.internal"),
        "alpha_tcp": await ask(e, a1.id, "alpha.internal", ASK_TCP),
    }
    seen["addresses"] = {name: m.private_ip for name, m in made.items()}
    seen["by_name"] = await reach(e, a1.id, f"{a2.id}.vm.alpha.internal", 8080, body=True)
    await e.submit(a2.id, "destroy", {"force": True}, None)
    assert a2.private_ip
    seen["gone_after"] = await until_gone(e, a1.id, "alpha.internal", a2.private_ip)


def main() -> None:
    tmp = Path(sys.argv[1])
    outside = f"skn{os.getpid()}-out"
    (tmp / "outside").write_text(outside)
    nats: subprocess.Popen[bytes] | None = None
    try:
        make_host(outside)
        nats = subprocess.Popen(
            [shutil.which("nats-server") or "nats-server", "-a", "::", "-p", str(NATS_PORT)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        print(json.dumps(asyncio.run(scenario(tmp))))
    finally:
        if nats is not None:
            nats.kill()
            nats.wait()
        subprocess.run(["ip", "netns", "del", outside], capture_output=True, check=False)


if __name__ == "__main__":
    main()
