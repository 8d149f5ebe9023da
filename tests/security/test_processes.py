"""A secured cluster as processes on loopback, set up as the README does it: a cluster CA, a
nats-server configured by `souk nats config` (mutual TLS, users mapped from certificates,
permissions by role), two `souk worker --tls-dir` serving mutual TLS only and signing their
catalog rows, two `souk broker --tls-dir` (one hosting the app registry and signing its rows, the
other forwarding to its HTTPS listener) whose replicas apply only signed rows, and a
`souk proxy --tls-dir` serving HTTPS from a signed replica of its own. An app is placed, listed
and scaled from zero through the proxy, exactly as in a plain cluster; nothing is refused on the
way, and the bus admits no one the CA did not certify."""

from __future__ import annotations

import json
import os
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

from souk.broker.tokens import mint
from souk.node.cluster_secret import new_secret
from souk.pki import NodeFiles, client_context, init_ca
from tests.support.hello import hello_config
from tests.support.nats import NatsServer, can_connect, needs_nats
from tests.support.pki import Pki
from tests.support.ports import free_port
from tests.support.waiting import wait_until
from tests.support.worker_process import SOUK, CatalogWorker

pytestmark = [pytest.mark.integration, needs_nats]

WORKERS = {"w0": "mad", "w1": "ams"}
NODES = [
    *(f"worker:{name}@{region}" for name, region in WORKERS.items()),
    "broker:broker-0",
    "broker:broker-1",
    "proxy:proxy-1",
]


@dataclass
class SecureWorker(CatalogWorker):
    tls_dir: Path | None = None

    def argv(self) -> list[str]:
        assert self.tls_dir is not None
        return [*super().argv(), "--tls-dir", str(self.tls_dir)]


@dataclass
class Cluster:
    pki: Pki
    bus: str  # the nats-server's URL
    brokers: tuple[str, str]  # the registry's, then the other
    proxy: str
    token: str
    trust: ssl.SSLContext  # the cluster CA, no certificate: what a user's client holds
    files: dict[str, NodeFiles]

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

    def souk(self, *args: str) -> subprocess.CompletedProcess[str]:
        """The `souk` program, as an operator runs it against this cluster."""
        env = {**os.environ, "SOUK_CA": str(self.pki.ca_dir / "ca.crt"), "SOUK_TOKEN": self.token}
        return subprocess.run(
            [str(SOUK), *args], capture_output=True, text=True, env=env, timeout=60
        )


def ready(proc: subprocess.Popen[bytes], url: str, log: Path, ctx: ssl.SSLContext) -> None:
    deadline = time.monotonic() + 30
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


def configured_bus(pki: Pki, directory: Path) -> NatsServer:
    """`souk nats config` for the nodes of this cluster, served by a `bus` certificate."""
    server = pki.node("bus", "nats-1")
    port = free_port()
    conf = directory / "nats.conf"
    subprocess.run(
        [
            *(str(SOUK), "nats", "config", "--tls-dir", str(server.cert.parent)),
            *("--tls-name", "nats-1"),
            *("--out", str(conf), "--host", "127.0.0.1", "--port", str(port)),
            *(arg for node in NODES for arg in ("--node", node)),
        ],
        check=True,
        capture_output=True,
    )
    return NatsServer(port, config=conf, log_path=directory / "nats.log")


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    tmp_path = tmp_path_factory.mktemp("secured")
    pki = Pki(tmp_path)
    init_ca(pki.ca_dir)
    trust = ssl.create_default_context(cafile=pki.ca_dir / "ca.crt")
    operator = client_context(pki.node("operator", "ops"))
    bus = configured_bus(pki, tmp_path)
    bus.start()
    workers: list[SecureWorker] = []
    procs: list[subprocess.Popen[bytes]] = []
    files: dict[str, NodeFiles] = {}
    try:
        for name, region in WORKERS.items():
            files[name] = pki.node("worker", name)
            w = SecureWorker(
                data_dir=tmp_path / name,
                log_path=tmp_path / f"{name}.log",
                name=name,
                region=region,
                nats=bus.url,
                tls=operator,
                tls_dir=files[name].cert.parent,
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
            name = f"broker-{n}"
            files[name] = pki.node("broker", name)
            argv = [
                *("broker", "--listen", listen, "--nats", bus.url),
                *("--secret-file", str(tmp_path / "secret")),
                *("--tls-dir", str(files[name].cert.parent)),
                *("--tls-cert", str(files[name].cert), "--tls-key", str(files[name].key)),
            ]
            if n == 0:
                argv += ["--app-registry", str(tmp_path / "registry")]
            else:
                argv += ["--app-registry-url", f"https://{brokers[0]}"]
            commands[name] = (argv, f"https://{listen}/openapi.json")
        files["proxy-1"] = proxy_files = pki.node("proxy", "proxy-1")
        commands["proxy"] = (
            [
                *("proxy", "--listen", proxy, "--nats", bus.url, "--region", "ams"),
                *("--api", f"https://{brokers[1]}", "--token", token),
                *("--ca", str(proxy_files.ca), "--idle-timeout", "60"),
                *("--tls-dir", str(proxy_files.cert.parent)),
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
        yield Cluster(pki, bus.url, (urls[0], urls[1]), f"https://{proxy}", token, trust, files)
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
        bus.stop()


def test_a_secured_cluster_places_lists_and_scales_from_zero(cluster: Cluster) -> None:
    status, app = cluster.api(1, "POST", "/v1/apps", {"name": "hello"})  # forwarded to 0
    assert status == 201, app
    # Broker 1 reads apps from its replica: the registry's signed row reaches it over the bus.
    wait_until(lambda: cluster.api(1, "GET", "/v1/apps/hello")[0] == 200, 20, "app replicated")
    ids = []
    for region in ("mad", "ams"):
        body = {"region": region, "config": hello_config(), "skip_launch": True}
        status, machine = cluster.api(1, "POST", "/v1/apps/hello/machines", body)
        assert status == 200, machine
        assert machine["worker"] == {"mad": "w0", "ams": "w1"}[region]
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


def catalog_status(cluster: Cluster, broker: str) -> dict[str, Any]:
    """`souk catalog status --json` of a broker's replica, as an operator runs it."""
    done = cluster.souk("catalog", "status", "--api", broker, "--json")
    assert done.returncode == 0, done.stderr
    status: dict[str, Any] = json.loads(done.stdout)
    return status


def test_every_replica_is_signed_and_refuses_nothing_from_the_cluster(cluster: Cluster) -> None:
    for n, broker in enumerate(cluster.brokers):

        def sees_both(n: int = n) -> bool:
            status, workers = cluster.api(n, "GET", "/v1/catalog/workers")
            return status == 200 and sorted(w["id"] for w in workers) == sorted(WORKERS)

        wait_until(sees_both, 20, f"broker {n} sees both workers")
        _, workers = cluster.api(n, "GET", "/v1/catalog/workers")
        assert all(w["address"].startswith("https://127.0.0.1:") for w in workers), workers
        status = catalog_status(cluster, broker)
        assert status["security"] == "signed"
        heads = {o["owner"]: o["head"] for o in status["owners"]}
        assert set(WORKERS) <= set(heads) and all(heads[w] > 0 for w in WORKERS), heads
        # Beats that overtake the certificate a replica asks for when it starts are counted as
        # `unknown_signer`, and applied once it has it; anything else is a forgery or a fault.
        assert set(status["refused"]) <= {"unknown_signer"}, status["refused"]
        assert status["quarantined"] == []


async def test_the_bus_admits_no_client_without_a_certificate(cluster: Cluster) -> None:
    ca_only = ssl.create_default_context(cafile=cluster.pki.ca_dir / "ca.crt")
    assert not await can_connect(cluster.bus, None)  # anonymous, plain
    assert not await can_connect(cluster.bus, ca_only)  # TLS, but no certificate
    assert not await can_connect(cluster.bus, client_context(cluster.pki.node("worker", "w9")))
    assert await can_connect(cluster.bus, client_context(cluster.files["w0"]))
