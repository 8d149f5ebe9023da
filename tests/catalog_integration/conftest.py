"""A catalog of real processes: `nats-server`, `souk worker --nats` processes and
`souk catalog serve` replicas, all on loopback."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
import urllib.request
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

from tests.worker_integration.conftest import SOUK, WorkerProcess, free_port

NATS = shutil.which("nats-server")
needs_nats = pytest.mark.skipif(NATS is None, reason="nats-server is not installed")


def eventually(check: Callable[[], bool], timeout: float = 15.0, what: str = "") -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what}")
        time.sleep(0.05)


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@dataclass
class NatsServer:
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    config: Path | None = None  # a configuration file (with this port), else plain on loopback

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    def start(self) -> None:
        assert NATS is not None
        argv = [NATS, "-a", "127.0.0.1", "-p", str(self.port)]
        self.proc = subprocess.Popen(
            argv if self.config is None else [NATS, "-c", str(self.config)],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        eventually(self._listening, 10, "nats-server listening")

    def _listening(self) -> bool:
        import socket

        with socket.socket() as s:
            return s.connect_ex(("127.0.0.1", self.port)) == 0

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class CatalogWorker(WorkerProcess):
    region: str = "mad"
    nats: str = ""

    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("--region") + 1] = self.region
        return [*argv, "--nats", self.nats]


@dataclass
class ReplicaProcess:
    nats: str
    log_path: Path
    unreachable_after: float = 2.0
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    security: list[str] = field(default_factory=lambda: ["--insecure"])  # or --ca, --cert ...

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        argv = [
            str(SOUK),
            "catalog",
            "serve",
            "--nats",
            self.nats,
            "--listen",
            f"127.0.0.1:{self.port}",
            "--unreachable-after",
            str(self.unreachable_after),
            "--log-level",
            "warning",
            *self.security,
        ]
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        eventually(self._ready, 20, f"replica ready ({self.log_path})")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(self.log_path.read_text()[-2000:])
        try:
            get(self.url + "/v1/catalog/status")
        except OSError:
            return False
        return True

    def get(self, path: str) -> Any:
        return get(self.url + path)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()


@dataclass
class Cluster:
    nats: NatsServer
    workers: list[CatalogWorker]
    replicas: list[ReplicaProcess]
    tmp: Path

    def add_replica(self) -> ReplicaProcess:
        n = len(self.replicas)
        replica = ReplicaProcess(self.nats.url, self.tmp / f"replica{n}.log")
        replica.start()
        self.replicas.append(replica)
        return replica


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the module (starting seven processes is most of the time); each test
    leaves every process it stopped running again."""
    tmp_path = tmp_path_factory.mktemp("catalog")
    if NATS is None:
        pytest.skip("nats-server is not installed")
    nats = NatsServer()
    nats.start()
    workers = [
        CatalogWorker(
            data_dir=tmp_path / f"w{i}",
            log_path=tmp_path / f"w{i}.log",
            name=f"w{i}",
            region=("mad", "ams")[i % 2],
            nats=nats.url,
            driver="sim",
        )
        for i in range(5)
    ]
    c = Cluster(nats, workers, [], tmp_path)
    try:
        with ThreadPoolExecutor(len(workers)) as pool:  # processes start in parallel
            list(pool.map(lambda w: w.start(), workers))
        for _ in range(2):
            c.add_replica()
        yield c
    finally:
        for r in c.replicas:
            r.stop()
        for w in workers:
            w.close()
        nats.stop()
