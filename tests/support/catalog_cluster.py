"""A catalog of real processes: `nats-server`, `souk worker --nats` processes and
`souk catalog serve` replicas, all on loopback."""

from __future__ import annotations

import contextlib
import json
import subprocess
import urllib.request
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.nats import NatsServer
from tests.support.ports import free_port
from tests.support.waiting import wait_until
from tests.support.worker_process import SOUK, CatalogWorker


def get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=5) as resp:
        return json.loads(resp.read())


@dataclass
class ReplicaProcess:
    nats: str
    log_path: Path
    unreachable_after: float = 2.0
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    security: list[str] = field(default_factory=lambda: ["--insecure"])  # or --tls-dir DIR

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
        wait_until(self._ready, 20, f"replica ready ({self.log_path})")

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


@contextlib.contextmanager
def catalog_cluster(tmp_path: Path, workers: int = 5, replicas: int = 2) -> Iterator[Cluster]:
    """Sim-driver workers alternating between mad and ams, and replicas, over one nats-server;
    every process is stopped on the way out."""
    with NatsServer() as nats:
        procs = [
            CatalogWorker(
                data_dir=tmp_path / f"w{i}",
                log_path=tmp_path / f"w{i}.log",
                name=f"w{i}",
                region=("mad", "ams")[i % 2],
                nats=nats.url,
                driver="sim",
            )
            for i in range(workers)
        ]
        c = Cluster(nats, procs, [], tmp_path)
        try:
            with ThreadPoolExecutor(len(procs)) as pool:  # processes start in parallel
                list(pool.map(lambda w: w.start(), procs))
            for _ in range(replicas):
                c.add_replica()
            yield c
        finally:
            for r in c.replicas:
                r.stop()
            for w in procs:
                w.close()
