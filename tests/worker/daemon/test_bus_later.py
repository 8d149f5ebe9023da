"""Every part serves before the bus is up: a worker, a broker and a catalog replica started while
nothing listens at their NATS URL answer over HTTP at once, and join the catalog when NATS
comes."""

from __future__ import annotations

import json
import subprocess
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from souk.broker.tokens import mint
from souk.node.cluster_secret import new_secret, read_secret
from tests.support.catalog_cluster import ReplicaProcess
from tests.support.nats import NatsServer, needs_nats
from tests.support.ports import free_port
from tests.support.waiting import wait_until
from tests.support.worker_process import SOUK, CatalogWorker


def _get(url: str, token: str | None = None) -> tuple[int, Any]:
    req = urllib.request.Request(url)
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=5) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def _answers(url: str, token: str) -> bool:
    try:
        return _get(url, token)[0] == 200
    except OSError:
        return False


@needs_nats
def test_worker_broker_and_replica_serve_without_nats_and_join_when_it_starts(
    tmp_path: Path,
) -> None:
    nats = NatsServer(log_path=tmp_path / "nats.log")  # not started yet: nothing listens
    worker = CatalogWorker(
        data_dir=tmp_path / "w1", log_path=tmp_path / "w1.log", nats=nats.url, driver="sim"
    )
    secret = tmp_path / "secret"
    secret.write_bytes(new_secret() + b"\n")
    token = mint(read_secret(secret), operator=True)
    broker_port = free_port()
    broker_url = f"http://127.0.0.1:{broker_port}"
    replica = ReplicaProcess(nats.url, tmp_path / "replica.log")
    broker: subprocess.Popen[bytes] | None = None
    try:
        worker.start()  # returns once its HTTP API answers, or fails the test
        status = worker.ok("GET", "/v1/status")
        assert (status["bus"]["state"], status["bus"]["connected"]) == ("connecting", False)
        created = worker.create({"init": {"exec": ["sleep", "600"]}}, start=False)
        assert created["state"] == "created"

        with open(tmp_path / "broker.log", "ab") as log:
            broker = subprocess.Popen(
                [
                    str(SOUK),
                    "broker",
                    "--listen",
                    f"127.0.0.1:{broker_port}",
                    "--secret-file",
                    str(secret),
                    "--nats",
                    nats.url,
                    "--log-level",
                    "warning",
                ],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
            )
        wait_until(lambda: _answers(broker_url + "/v1/workers", token), 20, "broker answers")
        assert _get(broker_url + "/v1/workers", token)[1] == []
        replica.start()  # returns once /v1/catalog/status answers
        assert replica.get("/v1/catalog/status")["owners"] == []
        assert broker.poll() is None and worker.proc is not None and worker.proc.poll() is None

        nats.start()

        def broker_sees_worker() -> bool:
            return [w["id"] for w in _get(broker_url + "/v1/workers", token)[1]] == ["w1"]

        wait_until(broker_sees_worker, 20, "the broker lists the worker")
        wait_until(
            lambda: [o["owner"] for o in replica.get("/v1/catalog/status")["owners"]] == ["w1"],
            20,
            "the replica follows the worker",
        )
        wait_until(
            lambda: len(replica.get("/v1/catalog/machines")) == 1, 20, "the replica has its rows"
        )
        assert worker.ok("GET", "/v1/status")["bus"]["state"] == "connected"
    finally:
        if broker is not None:
            broker.kill()
            broker.wait()
        replica.stop()
        worker.close()
        nats.stop()
