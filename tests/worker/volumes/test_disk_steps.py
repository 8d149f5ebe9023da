"""Each storage step run twice, and after a half-done first run, as a crash leaves it: the second
run finds what the first did and leaks nothing."""

from __future__ import annotations

import subprocess
import threading
from pathlib import Path

from souk.worker.volumes import disk as volume_disk
from tests.worker.volumes.conftest import leftovers


def test_every_step_is_idempotent_and_cleans_up_a_half_done_run(data_dir: Path) -> None:
    p = volume_disk.paths(data_dir, "vol_aaaaaa1")
    p.root.mkdir(parents=True)
    (p.root / "disk.img.tmp").write_bytes(b"half a file from a killed run")
    for _ in range(2):
        volume_disk.make_disk(p, 16)
    assert not (p.root / "disk.img.tmp").exists()
    first = volume_disk.attach(p)
    assert volume_disk.attach(p) == first and volume_disk.loop_devices(p.image) == [first]
    for _ in range(2):
        volume_disk.mount(p)
    (p.mountpoint / "note").write_text("kept")
    # a snapshot killed while the file system was frozen, its copy half made
    subprocess.run(["fsfreeze", "-f", str(p.mountpoint)], check=True)
    p.snapshots.mkdir(mode=0o700)
    (p.snapshots / "vs_aaaaaa1_1.img.tmp").write_bytes(b"partial")
    size = volume_disk.snapshot(p, "vs_aaaaaa1_1")
    assert size == volume_disk.snapshot(p, "vs_aaaaaa1_1") > 0
    assert sorted(f.name for f in p.snapshots.iterdir()) == ["vs_aaaaaa1_1.img"]
    (p.mountpoint / "after").write_text("writes go on: it was thawed")
    for _ in range(2):
        volume_disk.grow(p, 24)
    assert (p.mountpoint / "note").read_text() == "kept"
    for _ in range(2):
        volume_disk.unmount(p)
        volume_disk.detach(p)
        volume_disk.remove(p)
    assert leftovers(data_dir) == {"loops": [], "mounts": [], "files": []}


def test_a_tool_left_running_by_a_killed_worker_keeps_the_volume_locked(data_dir: Path) -> None:
    p = volume_disk.paths(data_dir, "vol_aaaaaa1")
    data_dir.mkdir(parents=True)
    release = threading.Event()
    with volume_disk.exclusive(p):  # a tool started under the lock, then its worker is gone
        orphan = subprocess.Popen(
            ["sh", "-c", f"read line; touch {data_dir}/finished"],
            stdin=subprocess.PIPE,
            pass_fds=volume_disk.held(),
        )
    order: list[str] = []

    def resumed_step() -> None:
        with volume_disk.exclusive(p):
            finished = (data_dir / "finished").exists()
            order.append("step ran" if finished else "raced the orphan")
        release.set()

    threading.Thread(target=resumed_step).start()
    assert not release.wait(0.3)  # still held by the orphan alone
    orphan.communicate(b"done\n")
    assert release.wait(10) and order == ["step ran"]
