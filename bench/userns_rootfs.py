"""What a container's user namespace costs its root filesystem: an overlay over idmapped layers, and
the fallback where the kernel has none (a private copy with every id shifted), against a plain
overlay mount (the baseline) and a plain copy, for a busybox image. Needs root and busybox.
Run: python bench/userns_rootfs.py [--runs N]"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import _harness  # noqa: F401  (puts the repository root on the path, for tests.support)

from souk.worker.host.identity import HostUser
from souk.worker.oci.rootfs import (
    idmap_supported,
    merge_copy,
    mount_overlay,
    overlay_supported,
    unmount,
    userns_fd,
)
from souk.worker.oci.unpack import unpack_layer
from tests.support.images import busybox_layer

USER = HostUser(uid=3_000_000, gid=3_000_000, span=65_536)


def timed(runs: int, setup: Callable[[Path], None], work: Path) -> list[float]:
    """Milliseconds per run of `setup` on a fresh directory, which is then removed."""
    times = []
    for i in range(runs):
        target = work / f"run{i}"
        start = time.perf_counter()
        setup(target)
        times.append((time.perf_counter() - start) * 1000)
        if (target / "rootfs").is_mount():
            unmount(target / "rootfs")
        shutil.rmtree(target)
    return times


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--runs", type=int, default=30)
    args = parser.parse_args()
    if os.geteuid() != 0:
        raise SystemExit("needs root")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        blob = work / "busybox.tar"
        blob.write_bytes(busybox_layer().bytes())
        overlay = overlay_supported(work / "scratch")
        idmap = overlay and idmap_supported(work / "scratch")
        layer = work / "layer"
        size = unpack_layer(blob, layer, overlay)
        entries = sum(len(dirs) + len(files) for _, dirs, files in os.walk(layer))

        def mounted(user: HostUser | None) -> Callable[[Path], None]:
            def setup(d: Path) -> None:
                mount_overlay([layer], d / "upper", d / "work", d / "rootfs", user)

            return setup

        def copied(user: HostUser | None) -> Callable[[Path], None]:
            return lambda d: merge_copy([layer], d / "rootfs", user)

        start = time.perf_counter()
        userns_fd(USER)  # made once per app range, then kept
        first = (time.perf_counter() - start) * 1000
        cases: list[tuple[str, Callable[[Path], None]]] = [("copy", copied(None))]
        cases.append(("copy, ids shifted (the fallback)", copied(USER)))
        if overlay:
            cases.insert(0, ("overlay (baseline)", mounted(None)))
        if idmap:
            cases.insert(1, ("overlay, idmapped layer", mounted(USER)))
        results = [(name, statistics.median(timed(args.runs, fn, work))) for name, fn in cases]
    base = results[0][1]
    print(f"busybox layer: {entries} entries, {size / 1e6:.1f} MB; median of {args.runs} runs")
    print(f"{'root filesystem':36} {'ms':>8} {'x baseline':>11}")
    for name, ms in results:
        print(f"{name:36} {ms:8.2f} {ms / base:11.1f}")
    print(f"{'user namespace for a range (once)':36} {first:8.2f} {first / base:11.1f}")


if __name__ == "__main__":
    main()
