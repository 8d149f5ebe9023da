"""Machines that mount volumes: the process driver's view of one, one machine at a time, the
data outliving the machine."""

from __future__ import annotations

from typing import Any

from souk.worker.engine import Engine
from souk.worker.volumes import disk as volume_disk
from tests.support.clients import Client
from tests.worker.volumes.test_worker_volumes import make, ok, refused

# Writes its argument into the volume (found as the working directory's ./data), then tries to
# write 40 MB into it and records whether the file system said no.
WRITER = (
    'printf %s "$1" > data/note && '
    "(dd if=/dev/zero of=data/big bs=1M count=40 2>/dev/null && echo fits || echo full) "
    '> data/verdict; rm -f data/big; test "$SOUK_VOLUME_PATH" -ef data && echo same > data/env; '
    "exec sleep 30"
)


def machine(vid: str, note: str = "hello") -> dict[str, Any]:
    return {
        "app": "demo",
        "config": {
            "init": {"exec": ["sh", "-c", WRITER, "sh", note]},
            "mounts": [{"volume": vid, "path": "/data"}],
        },
    }


async def wait(client: Client, mid: str, state: str) -> None:
    resp = await client.get(f"/v1/machines/{mid}/wait", params={"state": state, "timeout": "15"})
    assert resp.status == 200, await resp.text()


async def until_file(path: Any) -> str:
    import asyncio

    for _ in range(300):
        if path.exists() and path.read_text():
            return str(path.read_text())
        await asyncio.sleep(0.02)
    raise AssertionError(f"{path} never written")


async def test_a_machine_writes_its_volume_and_the_volume_outlives_it(
    vclient: Client, vengine: Engine
) -> None:
    await make(vclient, "vol_aaaaaa1", 16)
    mnt = volume_disk.paths(vengine.settings.data_dir, "vol_aaaaaa1").mountpoint
    first = await ok(await vclient.post("/v1/machines", json=machine("vol_aaaaaa1", "one")), 201)
    await wait(vclient, first["id"], "started")
    assert await until_file(mnt / "verdict") == "full\n"  # 40 MB do not fit in 16
    assert (mnt / "note").read_text() == "one"
    assert await until_file(mnt / "env") == "same\n"
    volume = await ok(await vclient.get("/v1/volumes/vol_aaaaaa1"))
    assert volume["attached_machine_id"] == first["id"]
    # one machine at a time; and a mounted volume is not destroyed
    resp = await vclient.post("/v1/machines", json=machine("vol_aaaaaa1"))
    await refused(resp, 409, "volume_attached")
    await refused(await vclient.delete("/v1/volumes/vol_aaaaaa1"), 409, "volume_attached")
    # stop and start: the same data
    (mnt / "verdict").unlink()
    await ok(await vclient.post(f"/v1/machines/{first['id']}/stop", json={"timeout": "1s"}))
    await wait(vclient, first["id"], "stopped")
    assert (mnt / "note").read_text() == "one"
    await ok(await vclient.post(f"/v1/machines/{first['id']}/start"))
    await wait(vclient, first["id"], "started")
    assert await until_file(mnt / "verdict") == "full\n"
    # destroyed: the volume is free for a new machine, which finds the data
    await ok(await vclient.delete(f"/v1/machines/{first['id']}", params={"force": "true"}))
    await wait(vclient, first["id"], "destroyed")
    volume = await ok(await vclient.get("/v1/volumes/vol_aaaaaa1"))
    assert volume["attached_machine_id"] is None
    reader = {
        "app": "demo",
        "config": {
            "init": {"exec": ["sh", "-c", "cp data/note data/copy; exec sleep 30"]},
            "mounts": [{"volume": "vol_aaaaaa1", "path": "/data"}],
        },
    }
    second = await ok(await vclient.post("/v1/machines", json=reader), 201)
    await wait(vclient, second["id"], "started")
    assert await until_file(mnt / "copy") == "one"
    await ok(await vclient.delete(f"/v1/machines/{second['id']}", params={"force": "true"}))
    await wait(vclient, second["id"], "destroyed")
    await ok(await vclient.delete("/v1/volumes/vol_aaaaaa1"))


async def test_a_mount_names_a_volume_of_this_worker_and_app(
    vclient: Client, vengine: Engine
) -> None:
    resp = await vclient.post("/v1/machines", json=machine("vol_nowhere1"))
    body = await refused(resp, 412, "volume_unavailable")
    assert body["details"] == {"volume": "vol_nowhere1", "worker": "w1"}
    await make(vclient, "vol_aaaaaa1", 16)
    other = machine("vol_aaaaaa1")
    other["app"] = "other"
    await refused(await vclient.post("/v1/machines", json=other), 412, "volume_unavailable")
    bad = machine("vol_aaaaaa1")
    bad["config"]["mounts"][0]["path"] = "/../etc"
    assert (await vclient.post("/v1/machines", json=bad)).status == 400
    two = machine("vol_aaaaaa1")
    two["config"]["mounts"].append({"volume": "vol_aaaaaa1", "path": "/other"})
    assert (await vclient.post("/v1/machines", json=two)).status == 400
    # nothing was attached by the refusals
    volume = await ok(await vclient.get("/v1/volumes/vol_aaaaaa1"))
    assert volume["attached_machine_id"] is None
