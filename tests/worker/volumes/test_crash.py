"""`kill -9` of a real `souk worker` process in the middle of volume operations: every
acknowledged volume survives with its data, every operation resumes, and once all are destroyed
no loop device, mount or file is left."""

from __future__ import annotations

import hashlib
import os
import random
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from souk.worker.volumes import disk as volume_disk
from tests.support.volumes import sweep
from tests.support.worker_process import Reply, WorkerProcess
from tests.worker.volumes.conftest import leftovers

pytestmark = pytest.mark.integration  # real worker processes, killed and started again


@dataclass
class VolumeWorker(WorkerProcess):
    disk_mb: int = 1024

    def argv(self) -> list[str]:
        return [*super().argv(), "--disk-mb", str(self.disk_mb)]


@pytest.fixture
def worker(tmp_path: Path) -> Iterator[VolumeWorker]:
    w = VolumeWorker(data_dir=tmp_path / "w1", log_path=tmp_path / "w1.log")
    w.start()
    try:
        yield w
    finally:
        w.close()
        sweep(w.data_dir)


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def killed_during(w: VolumeWorker, method: str, path: str, body: Any, delay: float) -> Reply | None:
    """Send the request, `kill -9` the worker `delay` seconds later, start it again. The reply,
    if one came before the kill."""
    got: list[Reply] = []

    def send() -> None:
        try:
            got.append(w.call(method, path, body, timeout=30))
        except OSError:
            pass

    sender = threading.Thread(target=send)
    sender.start()
    time.sleep(delay)
    w.kill9()
    sender.join()
    w.start()
    return got[0] if got else None


def settle(w: VolumeWorker) -> list[dict[str, Any]]:
    """Every volume, once no operation is left running: a snapshot queued behind each volume's
    queue is answered only once the queue before it has run."""
    volumes: list[dict[str, Any]] = w.ok("GET", "/v1/volumes")
    for v in volumes:
        if v["state"] in ("created", "extending"):
            w.ok("POST", f"/v1/volumes/{v['id']}/snapshots", status=201)
    deadline = time.monotonic() + 30
    while any(v["state"] not in ("created",) for v in volumes) and time.monotonic() < deadline:
        time.sleep(0.05)
        volumes = w.ok("GET", "/v1/volumes")
    return volumes


def test_kill9_at_random_steps_loses_nothing_and_leaks_nothing(worker: VolumeWorker) -> None:
    rng = random.Random(int.from_bytes(os.urandom(4)))
    base = {"app": "demo", "name": "data"}
    worker.ok("POST", "/v1/volumes", {**base, "id": "vol_keep001", "size_mb": 16}, 201)
    keep = volume_disk.paths(worker.data_dir, "vol_keep001")
    (keep.mountpoint / "payload").write_bytes(os.urandom(2 << 20))
    want = digest(keep.mountpoint / "payload")
    acknowledged = {"vol_keep001"}
    size = 16
    for round_ in range(5):  # each operation once, killed at a random moment
        delay = rng.uniform(0.0, 0.25)
        op = ("create", "extend", "snapshot", "restore", "destroy")[round_ % 5]
        if op == "create":
            vid = f"vol_new{round_:04d}"
            body = {**base, "id": vid, "size_mb": 24}
            reply = killed_during(worker, "POST", "/v1/volumes", body, delay)
            if reply is not None and reply.status == 201:
                acknowledged.add(vid)
        elif op == "extend":
            size += 8
            path = "/v1/volumes/vol_keep001/extend"
            killed_during(worker, "PUT", path, {"size_mb": size}, delay)
        elif op == "snapshot":
            killed_during(worker, "POST", "/v1/volumes/vol_keep001/snapshots", None, delay)
        elif op == "restore":
            snaps = worker.ok("GET", "/v1/volumes/vol_keep001/snapshots")
            if snaps:
                vid = f"vol_res{round_:04d}"
                body = {**base, "id": vid, "snapshot_id": snaps[-1]["id"]}
                reply = killed_during(worker, "POST", "/v1/volumes", body, delay)
                if reply is not None and reply.status == 201:
                    acknowledged.add(vid)
        else:
            others = [v["id"] for v in settle(worker) if v["id"] != "vol_keep001"]
            if others:
                reply = killed_during(worker, "DELETE", f"/v1/volumes/{others[0]}", None, delay)
                if reply is None or reply.status == 200:  # no answer: it may have happened
                    acknowledged.discard(others[0])
        volumes = settle(worker)
        held = {v["id"] for v in volumes}
        assert acknowledged <= held, (op, acknowledged - held)
        assert all(v["state"] == "created" for v in volumes), volumes
        assert digest(keep.mountpoint / "payload") == want, op
    # the extend that ran last, killed or not, finishes with the same size asked again
    worker.ok("PUT", "/v1/volumes/vol_keep001/extend", {"size_mb": size})
    kept = worker.ok("GET", "/v1/volumes/vol_keep001")
    assert kept["size_mb"] == size and kept["bytes_total"] > (size - 8) << 20
    # a restored copy holds the payload as it was when its snapshot was taken
    for v in settle(worker):
        if v["id"].startswith("vol_res"):
            copy = volume_disk.paths(worker.data_dir, v["id"]).mountpoint / "payload"
            assert digest(copy) == want
    for v in settle(worker):
        worker.ok("DELETE", f"/v1/volumes/{v['id']}")
    assert worker.ok("GET", "/v1/volumes") == []
    assert worker.ok("GET", "/v1/capacity")["disk_mb_reserved"] == 0
    assert leftovers(worker.data_dir) == {"loops": [], "mounts": [], "files": []}


def test_data_written_by_a_machine_survives_kill9_and_a_lost_mount(worker: VolumeWorker) -> None:
    worker.ok(
        "POST",
        "/v1/volumes",
        {"app": "demo", "name": "data", "id": "vol_keep001", "size_mb": 16},
        201,
    )
    m = worker.create(
        {
            "init": {"exec": ["sh", "-c", "echo kept > data/note; exec sleep 60"]},
            "mounts": [{"volume": "vol_keep001", "path": "/data"}],
        }
    )
    worker.wait(m["id"], "started")
    p = volume_disk.paths(worker.data_dir, "vol_keep001")
    deadline = time.monotonic() + 10
    while not (p.mountpoint / "note").exists() and time.monotonic() < deadline:
        time.sleep(0.02)
    worker.kill9()
    worker.start()
    assert (p.mountpoint / "note").read_text() == "kept\n"
    worker.ok("DELETE", f"/v1/machines/{m['id']}?force=true")
    worker.wait(m["id"], "destroyed")
    # the host lost the mount and the loop device (a reboot): the worker makes them again
    worker.kill9()
    volume_disk.unmount(p)
    volume_disk.detach(p)
    worker.start()
    assert volume_disk.is_mounted(p.mountpoint)
    assert (p.mountpoint / "note").read_text() == "kept\n"
    assert worker.ok("GET", "/v1/volumes/vol_keep001")["attached_machine_id"] is None
