"""A rolling upgrade, both ways: the previous release's worker beside today's broker, and the
previous release's broker beside today's worker, on one real NATS bus. Each pair places, starts,
stops and destroys a machine through the broker: the catalog's messages, the offers and the
reservation calls cross the version line in both directions.

The previous release is taken from git history (its `src/` at `PREVIOUS`) and run with this
interpreter, whose packages it shares: a release that changed a dependency would be installed
into a venv of its own instead."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from souk.broker.tokens import mint
from souk.models.wire import PROTOCOL, PROTOCOL_HEADER
from souk.node.cluster_secret import new_secret
from souk.secret_files import write_secret
from tests.support.dev import Dev
from tests.support.machines import kill_machine_processes, recorded_ids
from tests.support.nats import NatsServer, needs_nats
from tests.support.ports import free_port
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, needs_nats]

ROOT = Path(__file__).resolve().parents[3]
PREVIOUS = "c03bc63"  # the last release before protocol versions were sent


@pytest.fixture(scope="module")
def previous_src(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("previous")
    archive = subprocess.run(
        ["git", "-C", str(ROOT), "archive", PREVIOUS, "src"], capture_output=True, check=False
    )
    if archive.returncode != 0:
        pytest.skip(f"release {PREVIOUS} is not in this checkout's history (a shallow clone?)")
    subprocess.run(["tar", "-x", "-C", str(out)], input=archive.stdout, check=True)
    return out / "src"


class Part:
    """One `souk` process of a given release."""

    def __init__(self, src: Path | None, argv: list[str], log: Path) -> None:
        env = dict(os.environ)
        if src is not None:  # the previous release: its sources first on the path
            env["PYTHONPATH"] = str(src)
        with log.open("ab") as out:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "souk", *argv],
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
            )
        self.log = log

    def alive(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"exited: {self.log.read_text()[-3000:]}")
        return True

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@pytest.fixture
def cluster_of(tmp_path: Path, previous_src: Path) -> Iterator[Any]:
    parts: list[Part] = []
    data_dirs: list[Path] = []

    def start(previous: str) -> tuple[str, str]:
        """A bus, a broker and a worker; `previous` names which of them is the old release."""
        nats = NatsServer()
        nats.start()
        parts.append(_NatsPart(nats))
        secret = tmp_path / "secret"
        write_secret(secret, new_secret() + b"\n")
        api = free_port()
        broker_src = previous_src if previous == "broker" else None
        worker_src = previous_src if previous == "worker" else None
        (tmp_path / "registry").mkdir()
        parts.append(
            Part(
                broker_src,
                [
                    *("broker", "--listen", f"127.0.0.1:{api}", "--secret-file", str(secret)),
                    *("--nats", nats.url, "--app-registry", str(tmp_path / "registry")),
                ],
                tmp_path / "broker.log",
            )
        )
        data = tmp_path / "w1"
        data_dirs.append(data)
        parts.append(
            Part(
                worker_src,
                [
                    *("worker", "--name", "w1", "--region", "mad", "--data-dir", str(data)),
                    *("--cpus", "4", "--memory-mb", "4096", "--nats", nats.url),
                    *("--listen", f"127.0.0.1:{free_port()}", "--log-level", "warning"),
                ],
                tmp_path / "worker.log",
            )
        )
        token = mint(secret.read_bytes().strip(), operator=True)
        return f"http://127.0.0.1:{api}", token

    try:
        yield start
    finally:
        for part in reversed(parts):
            part.stop()
        for data in data_dirs:
            if (data / "worker.db").exists():
                kill_machine_processes(recorded_ids(data / "worker.db"))


class _NatsPart(Part):
    def __init__(self, server: NatsServer) -> None:
        self.server = server

    def stop(self) -> None:
        self.server.stop()


def ready(broker: Dev) -> bool:
    try:
        return len(broker.call("GET", "/v1/workers")) == 1
    except (OSError, urllib.error.URLError):
        return False


@pytest.mark.parametrize("previous", ["worker", "broker"])
def test_a_machine_lives_its_whole_life_across_the_version_line(
    cluster_of: Any, previous: str
) -> None:
    broker = Dev(*cluster_of(previous))
    call = broker.call
    wait_until(lambda: ready(broker), 30, "the broker sees the worker")
    call("POST", "/v1/apps", {"app_name": "mixed", "org_slug": "personal"})
    base = "/v1/apps/mixed/machines"
    config = {"init": {"exec": ["sleep", "600"]}, "guest": {"cpus": 1, "memory_mb": 128}}
    machine = call("POST", base, {"region": "mad", "config": config})
    mid = machine["id"]
    call("GET", f"{base}/{mid}/wait?state=started&timeout=20")
    # The catalog carries it across too: the broker lists it from its replica.
    wait_until(
        lambda: [m["state"] for m in call("GET", base)] == ["started"],
        10,
        "the machine in the broker's list",
    )
    call("POST", f"{base}/{mid}/stop")
    call("GET", f"{base}/{mid}/wait?state=stopped&timeout=20")
    call("POST", f"{base}/{mid}/start")
    call("GET", f"{base}/{mid}/wait?state=started&timeout=20")
    call("DELETE", f"{base}/{mid}?force=true")
    deadline = time.monotonic() + 20
    while call("GET", base) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert call("GET", base) == []


def test_a_worker_refuses_a_caller_two_versions_away(cluster_of: Any) -> None:
    broker = Dev(*cluster_of("none"))
    wait_until(lambda: ready(broker), 30, "the broker sees the worker")
    worker = broker.call("GET", "/v1/workers")[0]["address"]
    far = urllib.request.Request(worker + "/v1/capacity", headers={PROTOCOL_HEADER: "99"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(far, timeout=10)
    assert refused.value.code == 400
    assert json.loads(refused.value.read())["status"] == "protocol_unsupported"
    with urllib.request.urlopen(worker + "/v1/capacity", timeout=10) as resp:  # none: release 0
        assert resp.headers[PROTOCOL_HEADER] == str(PROTOCOL)
