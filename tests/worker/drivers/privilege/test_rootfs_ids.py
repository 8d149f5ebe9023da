"""A container's root filesystem owned by its app's id range: idmapped layers under overlayfs, or a
copy with every id shifted."""

from __future__ import annotations

import os
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from souk.worker.host.identity import HostUser
from souk.worker.oci.rootfs import (
    idmap_supported,
    is_mounted,
    merge_copy,
    mount_overlay,
    unmount,
)

from .conftest import needs_root

pytestmark = needs_root

USER = HostUser(uid=3_000_000, gid=3_100_000, span=65_536)


def image_layer(root: Path) -> Path:
    """Files owned as an image's are: root's, a service user's, and one beyond any span."""
    (root / "etc").mkdir(parents=True)
    (root / "etc" / "passwd").write_text("root:x:0:0::/:/bin/sh\n")
    (root / "srv").mkdir()
    os.chown(root / "srv", 1000, 1001)
    (root / "srv" / "data").write_text("kept")
    os.chown(root / "srv" / "data", 1000, 1001)
    (root / "odd").write_text("")
    os.chown(root / "odd", 70_000, 70_000)
    os.symlink("etc/passwd", root / "link")
    os.lchown(root / "link", 5, 5)
    return root


def owners(root: Path) -> dict[str, tuple[int, int]]:
    names = ["", "etc", "etc/passwd", "srv", "srv/data", "odd", "link"]
    return {n: (os.lstat(root / n).st_uid, os.lstat(root / n).st_gid) for n in names}


def shifted(uid: int, gid: int) -> tuple[int, int]:
    return USER.uid + uid, USER.gid + gid


EXPECTED = {
    "": shifted(0, 0),
    "etc": shifted(0, 0),
    "etc/passwd": shifted(0, 0),
    "srv": shifted(1000, 1001),
    "srv/data": shifted(1000, 1001),
    "odd": shifted(65_534, 65_534),  # past the span: the range's nobody
    "link": shifted(5, 5),
}


def test_a_copy_shifts_every_id_into_the_range(tmp_path: Path) -> None:
    lower = image_layer(tmp_path / "layer")
    target = tmp_path / "rootfs"
    merge_copy([lower], target, USER)
    assert owners(target) == EXPECTED
    assert (target / "srv" / "data").read_text() == "kept"
    assert os.lstat(lower / "srv").st_uid == 1000  # the shared layer is untouched


def test_idmapped_layers_show_the_range_and_leave_the_layer_alone(tmp_path: Path) -> None:
    if not idmap_supported(tmp_path / "scratch"):
        pytest.skip("this kernel or filesystem has no idmapped overlay layers")
    lower = image_layer(tmp_path / "layer")
    merged = tmp_path / "m" / "rootfs"
    mount_overlay([lower], tmp_path / "m" / "upper", tmp_path / "m" / "work", merged, USER)
    try:
        seen = owners(merged)
        (merged / "srv" / "data").write_text("changed")  # copied up, with the shifted owner
        upper = os.lstat(tmp_path / "m" / "upper" / "srv" / "data")
    finally:
        unmount(merged)
    odd = seen.pop("odd")
    assert seen == {k: v for k, v in EXPECTED.items() if k != "odd"}
    assert odd == (65_534, 65_534)  # unmapped: the kernel's overflow id, never a real owner's
    assert (upper.st_uid, upper.st_gid) == shifted(1000, 1001)
    assert (lower / "srv" / "data").read_text() == "kept"
    assert os.lstat(lower / "srv").st_uid == 1000
    assert not (tmp_path / "m" / "layers").exists()  # the layer mounts were let go
    assert not is_mounted(merged)


def test_probes_at_once_probe_once_and_leave_no_mount(tmp_path: Path) -> None:
    """Containers starting together all ask at first; their probes once shared one mount point
    and left it mounted."""
    scratch = tmp_path / "scratch"
    with ThreadPoolExecutor(8) as pool:
        answers = set(pool.map(lambda _: idmap_supported(scratch), range(8)))
    assert len(answers) == 1
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(scratch) not in mounts
    assert not (scratch / "idmap-probe").exists()
