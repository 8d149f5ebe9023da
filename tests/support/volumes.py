"""Volumes a test or a benchmark leaves behind: swept, so the host keeps its loop devices and
mounts."""

from __future__ import annotations

import subprocess
from pathlib import Path

from souk.worker import volume_disk


def sweep(data_dir: Path) -> None:
    """Whatever a test left: unmount, detach, so the host keeps its loop devices and mounts."""
    kept = volume_disk.volumes_dir(data_dir.resolve())
    for p in sorted(kept.glob("*")) if kept.exists() else []:
        paths = volume_disk.VolumePaths(p)
        try:
            volume_disk.unmount(paths)
            volume_disk.detach(paths)
        except volume_disk.DiskError:
            pass
    while volume_disk.is_mounted(kept):  # the worker's shared mount of them
        subprocess.run(["umount", str(kept)], check=True)
