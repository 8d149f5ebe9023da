"""Volumes a test or a benchmark leaves behind: swept, so the host keeps its loop devices and
mounts."""

from __future__ import annotations

from pathlib import Path

from souk.worker.volumes import disk as volume_disk


def sweep(data_dir: Path) -> None:
    """Whatever a test left: unmount, detach, so the host keeps its loop devices and mounts."""
    volume_disk.release_all(data_dir)
