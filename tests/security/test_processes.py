"""A secured cluster as processes on loopback: nats-server (plain: the catalog's own TLS is not
part of this test), two `souk worker --tls-dir` serving mutual TLS only, two `souk broker` (one
hosting the app registry, the other forwarding to its HTTPS listener) reaching the workers with
their certificates, and a `souk proxy` serving HTTPS. An app is placed, listed and scaled from
zero through the proxy, exactly as in a plain cluster."""

from __future__ import annotations

import json
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from souk.broker.tokens import mint, new_secret
from souk.pki import client_context, init_ca
from tests.pki.conftest import Pki
from tests.support.hello import hello_config
from tests.support.nats import NatsServer, needs_nats
from tests.support.ports import free_port
from tests.support.worker_process import SOUK, CatalogWorker

pytestmark = [pytest.mark.integration, needs_nats]


@dataclass
class SecureWorker(CatalogWorker):
    tls_dir: Path | None = None

    def argv(self) -> list[str]:
        assert self.tls_dir is not None
        return [*super().argv(), "--tls-dir", str(self.tls_dir)]


@dataclass
class Cluster:
    brokers: tuple[str, str]  # the registry's, then the other
    proxy: str
    token: str
    trust: ssl.SSLContext  # the cluster CA, no certificate: what a user's client holds

    def call(self, method: str, url: str, body: Any = None, **headers: str) -> tuple[int, Any]:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(url, data=data, method=method, headers=headers)
        if data is not None:
            req.add_header("Content-Type", "application/json")
        try:
            with urllib.request.urlopen(req, timeout=30, context=self.trust) as resp:
                return resp.status, json.loads(resp.read() or b"null")
        except urllib.error.HTTPError as exc:
            return exc.code, json.loads(exc.read() or b"null")

    def api(self, n: int, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        auth = f"Bearer {self.token}"
        return self.call(method, self.brokers[n] + path, body, Authorization=auth)


def ready(proc: subprocess.Popen[bytes], url: str, log: Path, ctx: ssl.SSLContext) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text()[-2000:])
        try:
            urllib.request.urlopen(url, timeout=1, context=ctx).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"not ready: {log.read_text()[-2000:]}")


@pytest.fixture
def cluster(tmp_path: Path) -> Iterator[Cluster]:
    pki = Pki(tmp_path)
    init_ca(pki.ca_dir)
    trust = ssl.create_default_context(cafile=pki.ca_dir / "ca.crt")
    operator = client_context(pki.node("operator", "ops"))
    nats = NatsServer()
    nats.start()
    workers: list[SecureWorker] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, region in enumerate(("mad", "ams")):
            w = SecureWorker(
                data_dir=tmp_path / f"w{i}",
                log_path=tmp_path / f"w{i}.log",
                name=f"w{i}",
                region=region,
                nats=nats.url,
                tls=operator,
                tls_dir=pki.node("worker", f"w{i}").cert.parent,
            )
            w.start()
            workers.append(w)
        secret = new_secret()
        (tmp_path / "secret").write_bytes(secret + b"\n")
        token = mint(secret, operator=True)
        brokers = [f"127.0.0.1:{free_port()}" for _ in range(2)]
        proxy = f"127.0.0.1:{free_port()}"
        commands: dict[str, tuple[list[str], str]] = {}
        for n, listen in enumerate(brokers):
            files = pki.node("broker", f"broker-{n}")
            argv = [
                *("broker", "--listen", listen, "--nats", nats.url),
                *("--secret-file", str(tmp_path / "secret")),
                *("--tls-dir", str(files.cert.parent)),
                *("--tls-cert", str(files.cert), "--tls-key", str(files.key)),
            ]
            if n == 0:
                argv += ["--app-registry", str(tmp_path / "registry")]
            else:
                argv += ["--app-registry-url", f"https://{brokers[0]}"]
            commands[f"broker-{n}"] = (argv, f"https://{listen}/openapi.json")
        proxy_files = pki.node("proxy", "proxy-1")
        commands["proxy"] = (
            [
                *("proxy", "--listen", proxy, "--nats", nats.url, "--region", "ams"),
                *("--api", f"https://{brokers[1]}", "--token", token),
                *("--ca", str(proxy_files.ca), "--idle-timeout", "60"),
                *("--tls-cert", str(proxy_files.cert), "--tls-key", str(proxy_files.key)),
            ],
            f"https://{proxy}/.souk/health",
        )
        for name, (argv, probe) in commands.items():
            log = tmp_path / f"{name}.log"
            with open(log, "ab") as out:
                proc = subprocess.Popen(
                    [str(SOUK), *argv, "--log-level", "warning"],
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=out,
                )
            procs.append(proc)
            ready(proc, probe, log, trust)
        urls = tuple(f"https://{b}" for b in brokers)
        yield Cluster((urls[0], urls[1]), f"https://{proxy}", token, trust)
    finally:
        for proc in procs:
            proc.terminate()
            try:
                proc.wait(5)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()
        for w in workers:
            w.close()
        nats.stop()


def test_a_secured_cluster_places_lists_and_scales_from_zero(cluster: Cluster) -> None:
    status, app = cluster.api(1, "POST", "/v1/apps", {"name": "hello"})  # forwarded to 0
    assert status == 201, app
    ids = []
    for region in ("mad", "ams"):
        body = {"region": region, "config": hello_config(), "skip_launch": True}
        status, machine = cluster.api(1, "POST", "/v1/apps/hello/machines", body)
        assert status == 200, machine
        ids.append(machine["id"])

    deadline = time.monotonic() + 20
    while True:  # the other broker lists them once its catalog replica has them
        status, listed = cluster.api(0, "GET", "/v1/apps/hello/machines")
        if sorted(m["id"] for m in listed) == sorted(ids) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert sorted(m["id"] for m in listed) == sorted(ids)
    assert all(m["state"] in ("created", "stopped") for m in listed), listed

    deadline = time.monotonic() + 20
    while True:  # until the proxy's replica shows the machines (503 before, then 200)
        status, body = cluster.call("GET", f"{cluster.proxy}/x", **{"souk-app": "hello"})
        if status == 200 or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert status == 200, body
    assert body["machine"] == ids[1]  # its own region, ams, started through broker 1
    status, machine = cluster.api(0, "GET", f"/v1/apps/hello/machines/{ids[1]}")
    assert status == 200 and machine["state"] == "started"
    status, machine = cluster.api(0, "GET", f"/v1/apps/hello/machines/{ids[0]}")
    assert machine["state"] != "started"  # nothing asked for it
