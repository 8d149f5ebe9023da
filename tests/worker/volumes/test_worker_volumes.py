"""Volumes on one worker, in process, over its HTTP API: real loop devices, real ext4."""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path
from typing import Any

import pytest

from souk.worker.engine import Engine
from souk.worker.volumes import disk as volume_disk
from tests.support.clients import Client
from tests.support.waiting import eventually
from tests.worker.volumes.conftest import leftovers


async def ok(resp: Any, status: int = 200) -> Any:
    assert resp.status == status, await resp.text()
    return await resp.json()


async def refused(resp: Any, status: int, code: str) -> dict[str, Any]:
    body: dict[str, Any] = await resp.json()
    assert resp.status == status, body
    assert body["code"] == code, body
    return body


async def make(client: Client, vid: str, size_mb: int = 16, **extra: Any) -> dict[str, Any]:
    body = {"app": "demo", "id": vid, "name": "data", "size_mb": size_mb, **extra}
    volume: dict[str, Any] = await ok(await client.post("/v1/volumes", json=body), 201)
    return volume


def mountpoint(engine: Engine, vid: str) -> Path:
    return volume_disk.paths(engine.settings.data_dir, vid).mountpoint


async def test_a_volume_is_its_own_ext4_file_system_of_its_size(
    vclient: Client, vengine: Engine
) -> None:
    volume = await make(vclient, "vol_aaaaaa1", 32)
    assert volume["state"] == "created" and volume["zone"] == "w1"
    assert volume["size_mb"] == 32 and volume["size_gb"] == 1
    mnt = mountpoint(vengine, "vol_aaaaaa1")
    assert volume_disk.is_mounted(mnt)
    assert 20 << 20 < volume["bytes_total"] <= 32 << 20  # less ext4's own (journal, tables)
    # the file system, not the worker, enforces the size
    try:
        with open(mnt / "big", "wb") as f:
            for _ in range(40):
                f.write(b"\0" * (1 << 20))
        raise AssertionError("wrote 40 MB into a 32 MB volume")
    except OSError as exc:
        assert exc.errno == 28  # ENOSPC
    (mnt / "big").unlink()
    listed = await ok(await vclient.get("/v1/volumes", params={"app": "demo"}))
    assert [v["id"] for v in listed] == ["vol_aaaaaa1"]
    assert await ok(await vclient.get("/v1/volumes", params={"app": "other"})) == []


async def test_disk_is_reserved_against_disk_mb(vclient: Client, vengine: Engine) -> None:
    await make(vclient, "vol_aaaaaa1", 200)
    body = {"app": "demo", "id": "vol_aaaaaa2", "name": "data", "size_mb": 100}
    err = await refused(await vclient.post("/v1/volumes", json=body), 412, "insufficient_capacity")
    assert err["details"]["disk_mb_free"] == 56
    cap = await ok(await vclient.get("/v1/capacity"))
    assert cap["disk_mb_reserved"] == 200 and cap["disk_mb_free"] == 56
    # growth is reserved too
    resp = await vclient.put("/v1/volumes/vol_aaaaaa1/extend", json={"size_mb": 300})
    await refused(resp, 412, "insufficient_capacity")
    resp = await vclient.put("/v1/volumes/vol_aaaaaa1/extend", json={"size_mb": 100})
    await refused(resp, 409, "invalid_state")  # volumes only grow
    await ok(await vclient.delete("/v1/volumes/vol_aaaaaa1"))
    cap = await ok(await vclient.get("/v1/capacity"))
    assert cap["disk_mb_reserved"] == 0
    await make(vclient, "vol_aaaaaa2", 100)
    # an id is never reused
    again = {"app": "demo", "id": "vol_aaaaaa2", "name": "data", "size_mb": 8}
    await refused(await vclient.post("/v1/volumes", json=again), 409, "conflict")


async def test_extend_grows_the_mounted_file_system_keeping_its_data(
    vclient: Client, vengine: Engine
) -> None:
    await make(vclient, "vol_aaaaaa1", 16)
    mnt = mountpoint(vengine, "vol_aaaaaa1")
    payload = os.urandom(1 << 20)
    (mnt / "keep").write_bytes(payload)
    before = (await ok(await vclient.get("/v1/volumes/vol_aaaaaa1")))["bytes_total"]
    reply = await ok(await vclient.put("/v1/volumes/vol_aaaaaa1/extend", json={"size_mb": 48}))
    assert reply["needs_restart"] is False
    after = reply["volume"]
    assert after["state"] == "created" and after["size_mb"] == 48
    assert after["bytes_total"] > before + (24 << 20)
    assert (mnt / "keep").read_bytes() == payload
    with open(mnt / "fill", "wb") as f:  # the new room is usable
        f.write(b"\1" * (30 << 20))


async def test_snapshots_restore_byte_identical_and_keep_the_retention(
    vclient: Client, vengine: Engine
) -> None:
    await make(vclient, "vol_aaaaaa1", 16, snapshot_retention=2)
    mnt = mountpoint(vengine, "vol_aaaaaa1")
    payload = os.urandom(3 << 20)
    (mnt / "data.bin").write_bytes(payload)
    snap = await ok(await vclient.post("/v1/volumes/vol_aaaaaa1/snapshots"), 201)
    assert snap["id"].startswith("vs_aaaaaa1_") and snap["volume_size"] == 16 << 20
    (mnt / "data.bin").write_bytes(b"changed after the snapshot")
    for _ in range(2):
        await ok(await vclient.post("/v1/volumes/vol_aaaaaa1/snapshots"), 201)
    listed = await ok(await vclient.get("/v1/volumes/vol_aaaaaa1/snapshots"))
    assert len(listed) == 2 and snap["id"] not in [s["id"] for s in listed]
    files = list(volume_disk.paths(vengine.settings.data_dir, "vol_aaaaaa1").snapshots.iterdir())
    assert sorted(f.stem for f in files) == sorted(s["id"] for s in listed)
    # restore the pruned one: refused; restore the oldest kept: a new volume with its bytes
    gone = {"app": "demo", "id": "vol_bbbbbb1", "name": "copy", "snapshot_id": snap["id"]}
    await refused(await vclient.post("/v1/volumes", json=gone), 412, "volume_unavailable")
    (mnt / "data.bin").write_bytes(payload)
    fresh = await ok(await vclient.post("/v1/volumes/vol_aaaaaa1/snapshots"), 201)
    (mnt / "data.bin").write_bytes(b"and changed again")
    body = {"app": "demo", "id": "vol_bbbbbb1", "name": "copy", "snapshot_id": fresh["id"]}
    restored = await ok(await vclient.post("/v1/volumes", json=body), 201)
    assert restored["state"] == "created" and restored["size_mb"] == 16
    copy = (mountpoint(vengine, "vol_bbbbbb1") / "data.bin").read_bytes()
    assert hashlib.sha256(copy).digest() == hashlib.sha256(payload).digest()
    # another app may not restore it
    body = {"app": "other", "id": "vol_cccccc1", "name": "copy", "snapshot_id": fresh["id"]}
    await refused(await vclient.post("/v1/volumes", json=body), 412, "volume_unavailable")


async def test_destroy_leaves_nothing_behind(vclient: Client, vengine: Engine) -> None:
    await make(vclient, "vol_aaaaaa1", 16)
    await ok(await vclient.post("/v1/volumes/vol_aaaaaa1/snapshots"), 201)
    assert leftovers(vengine.settings.data_dir)["loops"]
    gone = await ok(await vclient.delete("/v1/volumes/vol_aaaaaa1"))
    assert gone["state"] == "destroyed"
    assert leftovers(vengine.settings.data_dir) == {"loops": [], "mounts": [], "files": []}
    await refused(await vclient.get("/v1/volumes/vol_aaaaaa1"), 404, "not_found")
    await refused(await vclient.delete("/v1/volumes/vol_aaaaaa1"), 404, "not_found")


async def test_bad_volume_requests_are_4xx(vclient: Client) -> None:
    bad = [
        {"app": "demo", "id": "vol_aaaaaa1", "name": "data"},  # no size
        {"app": "demo", "id": "nope", "name": "data", "size_mb": 16},
        {"app": "demo", "id": "vol_aaaaaa1", "name": "data", "size_mb": 1},
    ]
    for body in bad:
        assert (await vclient.post("/v1/volumes", json=body)).status == 400, body
    resp = await vclient.put("/v1/volumes/vol_zzzzzz1/extend", json={"size_mb": 64})
    await refused(resp, 404, "not_found")


async def test_a_worker_without_disk_refuses_with_a_reason(plain_client: Client) -> None:
    body = {"app": "demo", "id": "vol_aaaaaa1", "name": "data", "size_mb": 16}
    resp = await plain_client.post("/v1/volumes", json=body)
    err = await refused(resp, 412, "insufficient_capacity")
    assert "--disk-mb" in err["error"]


async def test_a_failed_operation_is_an_error_and_its_volume_can_be_destroyed(
    vclient: Client, vengine: Engine
) -> None:
    await make(vclient, "vol_aaaaaa1", 16)
    snap = await ok(await vclient.post("/v1/volumes/vol_aaaaaa1/snapshots"), 201)
    volume_disk.paths(vengine.settings.data_dir, "vol_aaaaaa1").snapshot(snap["id"]).unlink()
    body = {"app": "demo", "id": "vol_bbbbbb1", "name": "copy", "snapshot_id": snap["id"]}
    err = await refused(await vclient.post("/v1/volumes", json=body), 500, "volume_failed")
    assert "is gone" in err["error"]
    stuck = await ok(await vclient.get("/v1/volumes/vol_bbbbbb1"))
    assert stuck["state"] == "restoring"  # as far as it got, its disk still reserved
    cap = await ok(await vclient.get("/v1/capacity"))
    assert cap["disk_mb_reserved"] == 32
    await ok(await vclient.delete("/v1/volumes/vol_bbbbbb1"))
    cap = await ok(await vclient.get("/v1/capacity"))
    assert cap["disk_mb_reserved"] == 16


async def test_a_failed_extend_leaves_the_volume_as_it_was_and_extendable(
    vclient: Client, monkeypatch: pytest.MonkeyPatch
) -> None:
    await make(vclient, "vol_aaaaaa1", 16)
    real = volume_disk.grow_fs

    def refuse(p: volume_disk.VolumePaths) -> None:
        raise volume_disk.DiskError("resize2fs: the disk said no")

    monkeypatch.setattr(volume_disk, "grow_fs", refuse)
    put = vclient.put("/v1/volumes/vol_aaaaaa1/extend", json={"size_mb": 32})
    err = await refused(await put, 500, "volume_failed")
    assert "the disk said no" in err["error"]
    after = await ok(await vclient.get("/v1/volumes/vol_aaaaaa1"))
    assert after["state"] == "created" and after["bytes_total"] <= 16 << 20
    monkeypatch.setattr(volume_disk, "grow_fs", real)  # the same size again finishes it
    reply = await ok(await vclient.put("/v1/volumes/vol_aaaaaa1/extend", json={"size_mb": 32}))
    grown = reply["volume"]
    assert grown["state"] == "created" and grown["bytes_total"] > 16 << 20


async def test_retention_is_changed_in_place(vclient: Client, vengine: Engine) -> None:
    await make(vclient, "vol_aaaaaa1", 16)
    for _ in range(3):
        await ok(await vclient.post("/v1/volumes/vol_aaaaaa1/snapshots"), 201)
    assert len(await ok(await vclient.get("/v1/volumes/vol_aaaaaa1/snapshots"))) == 3
    changed = await ok(await vclient.put("/v1/volumes/vol_aaaaaa1", json={"snapshot_retention": 1}))
    assert changed["snapshot_retention"] == 1
    newest = await ok(await vclient.post("/v1/volumes/vol_aaaaaa1/snapshots"), 201)
    listed = await ok(await vclient.get("/v1/volumes/vol_aaaaaa1/snapshots"))
    assert [s["id"] for s in listed] == [newest["id"]]
    resp = await vclient.put("/v1/volumes/vol_aaaaaa1", json={"snapshot_retention": 0})
    assert resp.status == 400


async def test_a_mount_namespace_made_meanwhile_does_not_keep_a_volume_busy(
    vclient: Client, vengine: Engine
) -> None:
    """A process in a namespace of its own (as `ip netns exec` or a service with a private /tmp
    makes) copies the volume's mount; the unmounts an extend or a destroy make must reach it."""
    await make(vclient, "vol_aaaaaa1", 16)
    mnt = mountpoint(vengine, "vol_aaaaaa1")
    argv = ["unshare", "--mount", "--propagation", "slave", "sleep", "60"]
    neighbour = await asyncio.create_subprocess_exec(*argv)
    try:
        await eventually(lambda: _sees(neighbour.pid, mnt), timeout=5)
        reply = await ok(await vclient.put("/v1/volumes/vol_aaaaaa1/extend", json={"size_mb": 32}))
        assert reply["volume"]["state"] == "created" and reply["volume"]["size_mb"] == 32
        await ok(await vclient.delete("/v1/volumes/vol_aaaaaa1"))
        assert not _sees(neighbour.pid, mnt)  # gone there too, not only here
    finally:
        neighbour.kill()
        await neighbour.wait()
    assert leftovers(vengine.settings.data_dir)["loops"] == []


def _sees(pid: int, mountpoint: Path) -> bool:
    with open(f"/proc/{pid}/mountinfo") as f:
        return any(line.split()[4] == str(mountpoint) for line in f)
