"""Two hosts joined by the mesh, for the private network's tests: run as `python -m
tests.network.two_hosts DIR` in a network namespace of its own (host A; `test_mesh.py` starts
it under `unshare -n`), it makes host B in a namespace beside it, joined by a link of their own
(10.98.0.0/24), a nats-server on A, and a real `souk worker` on each host on the mesh
(wireguard-go here), each with machines; it probes from inside the machines what each reaches
on the other host and prints what it saw as JSON. Nothing it makes outlives it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from souk.network.mesh import interface_name
from tests.network.one_host import ASK, REACH, SERVE
from tests.support.worker_process import SOUK

A, B, C = "10.98.0.1", "10.98.0.2", "10.98.0.3"
API, NATS, MESH, BROKER, PROXY = 7100, 4222, 51820, 4280, 4300


def sh(*argv: str) -> None:
    subprocess.run(argv, check=True, capture_output=True)


def forwarding(prefix: list[str]) -> None:
    for knob in ("net.ipv4.ip_forward=1", "net.ipv6.conf.all.forwarding=1"):
        sh(*prefix, "sysctl", "-qw", knob)


def make_hosts(b: str, c: str | None = None) -> None:
    """This namespace is host A; `b` (and `c`) beside it, all on one bridge in A."""
    sh("ip", "link", "set", "lo", "up")
    forwarding([])
    sh("ip", "link", "add", "br0", "type", "bridge")
    sh("ip", "addr", "add", f"{A}/24", "dev", "br0")
    sh("ip", "link", "set", "br0", "up")
    for n, (netns, address) in enumerate([(b, B), (c, C)]):
        if netns is None:
            continue
        sh("ip", "netns", "add", netns)
        sh("ip", "-n", netns, "link", "set", "lo", "up")
        forwarding(["ip", "netns", "exec", netns])
        sh("ip", "link", "add", f"port{n}", "type", "veth", "peer", "name", "link0", "netns", netns)
        sh("ip", "link", "set", f"port{n}", "master", "br0")
        sh("ip", "link", "set", f"port{n}", "up")
        sh("ip", "-n", netns, "addr", "add", f"{address}/24", "dev", "link0")
        sh("ip", "-n", netns, "link", "set", "link0", "up")


def worker(
    tmp: Path, name: str, host: str, netns: str | None, region: str = "mad"
) -> subprocess.Popen[bytes]:
    argv = [str(SOUK), "worker", "--name", name, "--region", region]
    argv += ["--data-dir", str(tmp / name)]
    argv += ["--listen", f"{host}:{API}", "--insecure", "--nats", f"nats://{A}:{NATS}"]
    argv += ["--mesh-port", str(MESH), "--mesh-endpoint", f"{host}:{MESH}", "--no-fsync"]
    argv += ["--cpus", "8", "--memory-mb", "8192"]
    if netns is not None:
        argv = ["ip", "netns", "exec", netns, *argv]
    return started(tmp, name, argv)


def started(tmp: Path, name: str, argv: list[str]) -> subprocess.Popen[bytes]:
    log = (tmp / f"{name}.log").open("ab")
    return subprocess.Popen(argv, stdout=log, stderr=log, stdin=subprocess.DEVNULL)


def call(host: str, method: str, path: str, body: Any = None, timeout: float = 30) -> Any:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(f"http://{host}:{API}{path}", data=data, method=method)
    req.add_header("Content-Type", "application/json")
    with urllib.request.urlopen(req, timeout=timeout) as resp:
        text = resp.read()
    return json.loads(text) if text else None


def until(what: str, check: Any, timeout: float = 30) -> Any:
    deadline = time.monotonic() + timeout
    while True:
        try:
            found = check()
            if found:
                return found
        except (OSError, urllib.error.URLError, ValueError):
            pass
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what}")
        time.sleep(0.05)


def run_in(host: str, machine: str, argv: list[str]) -> str:
    out = call(host, "POST", f"/v1/machines/{machine}/exec", {"command": argv, "timeout": 20})
    return str(out["stdout"] or out["stderr"]).strip()


# SERVE on a second port too, 9090, which is no service of the machine's
SERVE_TWO = SERVE.replace(
    'S(("::", 8080), H).serve_forever()',
    "import threading\n"
    'threading.Thread(target=S(("::", 9090), H).serve_forever, daemon=True).start()\n'
    'S(("::", 8080), H).serve_forever()',
)


def create(host: str, app: str, network: str | None = None) -> dict[str, Any]:
    """A machine of `app` serving on 8080, its one service, and 9090."""
    config = {
        "init": {"exec": [sys.executable, "-c", SERVE_TWO]},
        "services": [{"internal_port": 8080}],
    }
    body: dict[str, Any] = {"app": app, "config": config}
    if network:
        body["network"] = network
    made: dict[str, Any] = call(host, "POST", "/v1/machines", body)
    call(host, "GET", f"/v1/machines/{made['id']}/wait?state=started&timeout=30")
    return made


def probe(address: str, port: int) -> str:
    """From this host (A): "open", "refused" or "dropped", as REACH says it."""
    done = subprocess.run(
        [sys.executable, "-c", REACH, address, str(port)], capture_output=True, text=True
    )
    return done.stdout.strip()


def peers_of(netns: str | None, node: str) -> list[str]:
    """The public keys host `netns` (this one if None) takes packets from on the mesh."""
    argv = ["wg", "show", interface_name(node), "peers"]
    if netns is not None:
        argv = ["ip", "netns", "exec", netns, *argv]
    return subprocess.run(argv, capture_output=True, text=True, check=True).stdout.split()


def rotated(tmp: Path, b: str, a1: dict[str, Any], b1: dict[str, Any]) -> dict[str, Any]:
    """Host A's key rotated as an operator does it: B takes the new key in place of the old,
    and a1 reaches b1 again."""
    seen: dict[str, Any] = {"peers_before": peers_of(b, "wb")}
    began = time.monotonic()
    argv = [str(SOUK), "mesh", "rotate", "--dir", str(tmp / "wa"), "--json"]
    keys = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    seen["old"], seen["new"] = keys["old_public_key"], keys["public_key"]
    reach = [sys.executable, "-c", REACH]
    seen["peers_after"] = until(
        "B takes A's new key", lambda: seen["new"] in peers_of(b, "wb") and peers_of(b, "wb")
    )
    seen["peers_in_s"] = time.monotonic() - began
    seen["a_key"] = subprocess.run(
        ["wg", "show", interface_name("wa"), "public-key"], capture_output=True, text=True
    ).stdout.strip()
    seen["reached"] = until(
        "a1 reaches b1 after the rotation",
        lambda: (
            (r := run_in(A, a1["id"], [*reach, b1["private_ip"], "8080", "body"])) == b1["id"] and r
        ),
    )
    seen["reached_in_s"] = time.monotonic() - began
    seen["back"] = run_in(B, b1["id"], [*reach, a1["private_ip"], "8080", "body"])
    return seen


def scenario(tmp: Path, b: str) -> dict[str, Any]:
    seen: dict[str, Any] = {}
    for host in (A, B):
        until(f"worker at {host}", lambda host=host: call(host, "GET", "/v1/machines") == [])
    a1 = create(A, "alpha")
    started = time.monotonic()
    b1 = create(B, "alpha")
    c1 = create(B, "beta", "personal/other")
    reach = [sys.executable, "-c", REACH]
    # by address, then by name, from a host away, once the mesh and the names have it
    seen["by_address"] = until(
        "a1 reaches b1",
        lambda: (
            (r := run_in(A, a1["id"], [*reach, b1["private_ip"], "8080", "body"])) == b1["id"] and r
        ),
    )
    seen["after_start_s"] = time.monotonic() - started
    name = f"{b1['id']}.vm.alpha.internal"
    seen["by_name"] = until(
        "a1 reaches b1 by name",
        lambda: (r := run_in(A, a1["id"], [*reach, name, "8080", "body"])) == b1["id"] and r,
    )
    seen["names"] = run_in(A, a1["id"], [sys.executable, "-c", ASK, "alpha.internal"]).split()
    seen["addresses"] = {"a1": a1["private_ip"], "b1": b1["private_ip"], "c1": c1["private_ip"]}
    seen["back"] = run_in(B, b1["id"], [*reach, a1["private_ip"], "8080", "body"])
    seen["to_other_network"] = run_in(A, a1["id"], [*reach, c1["private_ip"], "8080"])
    seen["from_other_network"] = run_in(B, c1["id"], [*reach, a1["private_ip"], "8080"])
    seen["other_host"] = run_in(A, a1["id"], [*reach, B, str(API)])
    # host A itself (as a proxy on it would, from its mesh address) reaches b1's service port
    # and no other; a1, of b1's network, reaches both
    seen["host_to_service"] = probe(b1["private_ip"], 8080)
    seen["host_to_other_port"] = probe(b1["private_ip"], 9090)
    seen["machine_to_other_port"] = run_in(A, a1["id"], [*reach, b1["private_ip"], "9090", "body"])
    seen["ids"] = {"a1": a1["id"], "b1": b1["id"], "c1": c1["id"]}
    # host B's link cut: nothing passes; restored: the mesh carries on by itself, and the names
    # never went (its machines run on)
    sh("ip", "-n", b, "link", "set", "link0", "down")
    seen["link_down"] = run_in(A, a1["id"], [*reach, b1["private_ip"], "8080"])
    seen["names_link_down"] = run_in(A, a1["id"], [sys.executable, "-c", ASK, name]).split()
    sh("ip", "-n", b, "link", "set", "link0", "up")
    restored = time.monotonic()
    seen["link_up"] = until(
        "a1 reaches b1 again",
        lambda: (r := run_in(A, a1["id"], [*reach, name, "8080", "body"])) == b1["id"] and r,
    )
    seen["converged_s"] = time.monotonic() - restored
    seen["rotation"] = rotated(tmp, b, a1, b1)
    return seen


def destroy_all() -> None:
    for host in (A, B):
        try:
            for m in call(host, "GET", "/v1/machines"):
                call(host, "DELETE", f"/v1/machines/{m['id']}?force=true")
                call(host, "GET", f"/v1/machines/{m['id']}/wait?state=destroyed&timeout=15")
        except (OSError, urllib.error.URLError):
            continue


def main() -> None:
    tmp = Path(sys.argv[1])
    b = f"skn{os.getpid()}-b"
    parts: list[subprocess.Popen[bytes]] = []
    try:
        make_hosts(b)
        nats = shutil.which("nats-server") or "nats-server"
        parts.append(
            subprocess.Popen(
                [nats, "-a", A, "-p", str(NATS)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        parts.append(worker(tmp, "wa", A, None))
        parts.append(worker(tmp, "wb", B, b))
        try:
            print(json.dumps(scenario(tmp, b)))
        finally:
            destroy_all()
    finally:
        teardown(parts, (b, "wb"))


def teardown(parts: list[subprocess.Popen[bytes]], *hosts: tuple[str, str]) -> None:
    """The parts stopped, last first, then the mesh's interfaces (this host's `wa`, and each
    other host's by its name) and the other hosts removed."""
    for part in reversed(parts):
        part.terminate()
        try:
            part.wait(10)
        except subprocess.TimeoutExpired:
            part.kill()
            part.wait()
    subprocess.run(["ip", "link", "del", interface_name("wa")], capture_output=True)
    for netns, name in hosts:
        subprocess.run(
            ["ip", "-n", netns, "link", "del", interface_name(name)], capture_output=True
        )
        subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


if __name__ == "__main__":
    main()
