"""Reading an image's files inside its root: the kernel's openat2 walk and the one souk makes
where the kernel has none agree, and neither ever reads a host file."""

from __future__ import annotations

import errno
import os
from pathlib import Path

import pytest

from souk.worker.oci import inroot


@pytest.fixture(params=["openat2", "walk"])
def method(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setattr(inroot, "_openat2", None if request.param == "openat2" else False)
    return str(request.param)


@pytest.fixture
def root(tmp_path: Path) -> Path:
    """An image's root beside a host file it must never reach."""
    (tmp_path / "host-secret").write_text("host\n")
    root = tmp_path / "rootfs"
    (root / "etc").mkdir(parents=True)
    (root / "usr" / "etc").mkdir(parents=True)
    (root / "etc" / "shadow").write_text("image shadow\n")
    (root / "usr" / "etc" / "group").write_text("image group\n")
    (root / "host-secret").write_text("image's own\n")
    links = {
        "etc/passwd": "/etc/shadow",  # absolute: from the image's root
        "etc/climb": "../../../../../../../host-secret",  # `..` stops at the root
        "etc/up": "../host-secret",
        "conf": "/usr/etc",  # a directory on the way
        "etc/dangling": str(tmp_path / "host-secret"),  # the host's path, inside the image
        "etc/loop": "/etc/loop",
        "etc/proc": "/proc/self/root/host-secret",
    }
    for name, target in links.items():
        (root / name).symlink_to(target)
    os.mkfifo(root / "etc" / "fifo")
    return root


@pytest.mark.parametrize(
    ("path", "content"),
    [
        ("/etc/passwd", b"image shadow\n"),
        ("etc/climb", b"image's own\n"),
        ("/etc/up", b"image's own\n"),
        ("/conf/group", b"image group\n"),
        ("/../../host-secret", b"image's own\n"),
        ("/etc/../etc/./shadow", b"image shadow\n"),
    ],
)
def test_links_resolve_inside_the_root(method: str, root: Path, path: str, content: bytes) -> None:
    assert inroot.read(root, path) == content


@pytest.mark.parametrize(
    ("path", "code"),
    [
        ("/etc/dangling", errno.ENOENT),
        ("/etc/loop", errno.ELOOP),
        ("/etc/proc", errno.ENOENT),  # no /proc in the image: never the host's
        ("/etc/fifo", errno.EINVAL),  # refused at once, not waited on
        ("/etc", errno.EINVAL),
    ],
)
def test_what_is_not_an_images_regular_file_is_refused(
    method: str, root: Path, path: str, code: int
) -> None:
    with pytest.raises(OSError) as raised:
        inroot.read(root, path)
    assert raised.value.errno == code


def test_a_file_over_the_limit_is_refused(method: str, root: Path) -> None:
    assert inroot.read(root, "/etc/shadow", limit=13) == b"image shadow\n"
    with pytest.raises(OSError) as raised:
        inroot.read(root, "/etc/shadow", limit=12)
    assert raised.value.errno == errno.EFBIG
