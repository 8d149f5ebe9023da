"""`souk proxy` as a process: nats-server, `souk worker --nats` processes, `souk broker --nats`
and `souk proxy --nats`, all on loopback. A request to an app scaled to zero is answered by a
machine the proxy started through the broker."""

from __future__ import annotations

import json
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from souk.broker.tokens import mint
from souk.node.cluster_secret import new_secret
from tests.support.hello import hello_config
from tests.support.nats import NatsServer, needs_nats
from tests.support.ports import free_port
from tests.support.worker_process import SOUK, CatalogWorker

pytestmark = [pytest.mark.integration, needs_nats]


def request(
    method: str, url: str, body: Any = None, headers: dict[str, str] | None = None
) -> tuple[int, dict[str, str], Any]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=30) as resp:
            return resp.status, dict(resp.headers), json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, dict(exc.headers), json.loads(exc.read() or b"null")


def ready(proc: subprocess.Popen[bytes], url: str, log: Path) -> None:
    deadline = time.monotonic() + 20
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(log.read_text()[-2000:])
        try:
            urllib.request.urlopen(url, timeout=1).close()
            return
        except urllib.error.HTTPError:
            return  # it answers
        except OSError:
            time.sleep(0.05)
    raise RuntimeError(f"not ready: {log.read_text()[-2000:]}")


@pytest.fixture
def processes(tmp_path: Path) -> Iterator[tuple[str, str, str]]:
    """Yields the broker's URL, an operator token and the proxy's URL."""
    nats = NatsServer()
    nats.start()
    workers: list[CatalogWorker] = []
    procs: list[subprocess.Popen[bytes]] = []
    try:
        for i, region in enumerate(("mad", "ams")):
            w = CatalogWorker(
                data_dir=tmp_path / f"w{i}",
                log_path=tmp_path / f"w{i}.log",
                name=f"w{i}",
                region=region,
                nats=nats.url,
            )
            w.start()
            workers.append(w)
        secret = new_secret()
        (tmp_path / "secret").write_bytes(secret + b"\n")
        token = mint(secret, operator=True)
        broker = f"127.0.0.1:{free_port()}"
        proxy = f"127.0.0.1:{free_port()}"
        commands = {
            "broker": (
                [
                    *("broker", "--listen", broker, "--nats", nats.url),
                    *("--secret-file", str(tmp_path / "secret")),
                    *("--app-registry", str(tmp_path / "registry")),
                ],
                f"http://{broker}/openapi.json",
            ),
            "proxy": (
                [
                    *("proxy", "--listen", proxy, "--nats", nats.url, "--region", "ams"),
                    *("--api", f"http://{broker}", "--token", token, "--idle-timeout", "60"),
                ],
                f"http://{proxy}/.souk/health",
            ),
        }
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
            ready(proc, probe, log)
        yield f"http://{broker}", token, f"http://{proxy}"
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


def test_souk_proxy_scales_an_app_from_zero(processes: tuple[str, str, str]) -> None:
    broker, token, proxy = processes
    auth = {"Authorization": f"Bearer {token}"}
    status, _, _ = request("POST", f"{broker}/v1/apps", {"name": "hello"}, auth)
    assert status == 201
    ids = []
    for region in ("mad", "ams"):
        body = {"region": region, "config": hello_config(), "skip_launch": True}
        status, _, machine = request("POST", f"{broker}/v1/apps/hello/machines", body, auth)
        assert status == 200, machine
        ids.append(machine["id"])

    deadline = time.monotonic() + 20
    while True:  # until the proxy's replica holds both (with one, it would wake that one)
        _, _, seen = request("GET", f"{proxy}/.souk/status", None, auth)
        if seen["machines_known"] == 2 or time.monotonic() > deadline:
            break
        time.sleep(0.05)
    status, headers, body = request("GET", f"{proxy}/x", headers={"souk-app": "hello"})
    assert status == 200, body
    assert headers["souk-machine"] == body["machine"] == ids[1]  # its own region, ams
    assert headers["souk-region"] == "ams"
    status, _, machine = request("GET", f"{broker}/v1/apps/hello/machines/{ids[1]}", None, auth)
    assert machine["state"] == "started"
    status, _, body = request("GET", f"{proxy}/x", headers={"Host": "nope.souk.local"})
    assert status == 404 and body["code"] == "app_not_found"
