"""A proxy on a host of its own, for the private network's tests: run as `python -m
tests.network.three_hosts DIR` in a network namespace of its own (host A; `test_proxy_mesh.py`
starts it under `unshare -n`). Host A runs a nats-server, a broker and a worker (region mad);
host B a worker (region ams); host C only `souk proxy`, on the mesh (`--mesh-port`). A machine
of the app is made on B and stopped; a request to the proxy on C wakes it and is answered by it,
two hosts away over the mesh. Prints what it saw as JSON; nothing it makes outlives it."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

from souk.broker.tokens import mint
from souk.node.cluster_secret import new_secret, read_secret
from souk.secret_files import write_secret
from tests.network import two_hosts as bed
from tests.support.hello import hello_config
from tests.support.worker_process import SOUK


def broker(tmp: Path, token: str) -> Any:
    def call(method: str, path: str, body: Any = None) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"http://{bed.A}:{bed.BROKER}{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Authorization", f"Bearer {token}")
        with urllib.request.urlopen(req, timeout=30) as resp:
            text = resp.read()
        return json.loads(text) if text else None

    return call


def through_proxy(path: str = "/") -> tuple[int, dict[str, str], str]:
    req = urllib.request.Request(f"http://{bed.C}:{bed.PROXY}{path}")
    req.add_header("Host", "hello.souk.local")
    with urllib.request.urlopen(req, timeout=30) as resp:
        return resp.status, dict(resp.headers), resp.read().decode()


def scenario(tmp: Path, token: str, b: str) -> dict[str, Any]:
    call = broker(tmp, token)
    seen: dict[str, Any] = {}
    bed.until("the broker sees both workers", lambda: len(call("GET", "/v1/workers")) == 2)
    call("POST", "/v1/apps", {"name": "hello"})
    m = call("POST", "/v1/apps/hello/machines", {"config": hello_config(), "region": "ams"})
    mid = m["id"]
    seen["worker"] = m.get("worker") or m.get("instance", {}).get("worker", "")
    call("GET", f"/v1/apps/hello/machines/{mid}/wait?state=started&timeout=30")
    call("POST", f"/v1/apps/hello/machines/{mid}/stop", {})
    call("GET", f"/v1/apps/hello/machines/{mid}/wait?state=stopped&timeout=30")
    seen["machine"] = mid
    seen["private_ip"] = m["private_ip"]
    started = time.monotonic()
    status, headers, body = bed.until("the proxy answers", lambda: through_proxy())
    seen["woken_in_s"] = time.monotonic() - started
    seen["status"] = status
    seen["answered_by"] = headers.get("souk-machine", "")
    seen["body"] = json.loads(body)
    seen["state"] = call("GET", f"/v1/apps/hello/machines/{mid}")["state"]
    seen["rotation"] = rotated(tmp, b)
    return seen


def rotated(tmp: Path, b: str) -> dict[str, Any]:
    """The proxy's host key rotated (`souk mesh rotate`): host B takes its new key in place of
    the old from its next announcement, and the proxy is answered by the machine again."""
    seen: dict[str, Any] = {"peers_before": bed.peers_of(b, "wb")}
    argv = [str(SOUK), "mesh", "rotate", "--dir", str(tmp / "proxy"), "--json"]
    keys = json.loads(subprocess.run(argv, capture_output=True, text=True, check=True).stdout)
    seen["old"], seen["new"] = keys["old_public_key"], keys["public_key"]
    began = time.monotonic()
    seen["peers_after"] = bed.until(
        "B takes the proxy's new key",
        lambda: (
            (peers := bed.peers_of(b, "wb"))
            and seen["new"] in peers
            and seen["old"] not in peers
            and peers
        ),
    )
    status, headers, _ = bed.until("the proxy answers again", lambda: through_proxy())
    seen["answered_in_s"] = time.monotonic() - began
    seen["status"], seen["answered_by"] = status, headers.get("souk-machine", "")
    return seen


def main() -> None:
    tmp = Path(sys.argv[1])
    b, c = f"skn{os.getpid()}-b", f"skn{os.getpid()}-c"
    secret = tmp / "secret"
    write_secret(secret, new_secret() + b"\n")
    token = mint(read_secret(secret), operator=True)
    parts: list[subprocess.Popen[bytes]] = []
    try:
        bed.make_hosts(b, c)
        nats = shutil.which("nats-server") or "nats-server"
        parts.append(
            subprocess.Popen(
                [nats, "-a", bed.A, "-p", str(bed.NATS)],
                stdout=subprocess.DEVNULL,
                stderr=subprocess.DEVNULL,
            )
        )
        nats_url = f"nats://{bed.A}:{bed.NATS}"
        parts.append(bed.worker(tmp, "wa", bed.A, None, "mad"))
        parts.append(bed.worker(tmp, "wb", bed.B, b, "ams"))
        registry = ["--app-registry", str(tmp / "registry"), "--secret-file", str(secret)]
        listen = ["--listen", f"{bed.A}:{bed.BROKER}", "--nats", nats_url, "--insecure"]
        parts.append(bed.started(tmp, "broker", [str(SOUK), "broker", *listen, *registry]))
        proxy = [str(SOUK), "proxy", "--listen", f"{bed.C}:{bed.PROXY}", "--insecure"]
        proxy += ["--api", f"http://{bed.A}:{bed.BROKER}", "--token", token, "--nats", nats_url]
        proxy += ["--mesh-port", str(bed.MESH), "--mesh-endpoint", f"{bed.C}:{bed.MESH}"]
        proxy += ["--mesh-dir", str(tmp / "proxy"), "--mesh-name", "pc"]
        parts.append(bed.started(tmp, "proxy", ["ip", "netns", "exec", c, *proxy]))
        try:
            print(json.dumps(scenario(tmp, token, b)))
        finally:
            bed.destroy_all()
    finally:
        bed.teardown(parts, (b, "wb"), (c, "pc"))


if __name__ == "__main__":
    main()
