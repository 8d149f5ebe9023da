"""Volumes: how long create, extend and snapshot take, and how fast a machine reads and writes its
volume against the same test on the host's disk directly, as ratios in one run.

An in-process worker (process driver) makes a volume and starts a machine that mounts it; the
machine runs this script's `--workload` on its volume (./data), then on a directory of the host's
disk beside the worker's data directory: sequential write (fdatasync at the end) and read
(O_DIRECT, so no page cache), then random 4 KiB writes (each O_DSYNC) and random O_DIRECT reads.
Both runs are in the same machine, one after the other, so only the storage differs. The goal:
a volume does at least 0.9x of the raw disk.

Usage: .venv/bin/python bench/volumes.py [--rounds 3] [--seq-mb 128] [--random-ops 1000] [--json]
Needs root, losetup and e2fsprogs.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import mmap
import os
import random
import shutil
import sys
import tempfile
import time
from dataclasses import asdict, dataclass
from pathlib import Path

from rich.console import Console
from rich.table import Table

from _harness import machine_info, pct

BLOCK = 4096


# --- the workload, run inside the machine ------------------------------------------------------


def _aligned(size: int) -> mmap.mmap:
    buf = mmap.mmap(-1, size)  # page-aligned, as O_DIRECT wants
    buf.write(os.urandom(size))
    return buf


def workload(directory: Path, seq_mb: int, random_ops: int) -> dict[str, float]:
    """MB/s for each pattern, on a file in `directory`."""
    path = directory / "bench.dat"
    chunk = 1 << 20
    buf = _aligned(chunk)
    out: dict[str, float] = {}
    began = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    for _ in range(seq_mb):
        os.write(fd, buf)
    os.fdatasync(fd)
    os.close(fd)
    out["seq_write"] = seq_mb / (time.perf_counter() - began)
    began = time.perf_counter()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    while os.readv(fd, [buf]) > 0:
        pass
    os.close(fd)
    out["seq_read"] = seq_mb / (time.perf_counter() - began)
    blocks = (seq_mb << 20) // BLOCK
    rng = random.Random(7)
    small = _aligned(BLOCK)
    began = time.perf_counter()
    fd = os.open(path, os.O_WRONLY | os.O_DSYNC)
    for _ in range(random_ops):
        os.pwrite(fd, small, rng.randrange(blocks) * BLOCK)
    os.close(fd)
    out["rand_write"] = random_ops * BLOCK / (1 << 20) / (time.perf_counter() - began)
    began = time.perf_counter()
    fd = os.open(path, os.O_RDONLY | os.O_DIRECT)
    for _ in range(random_ops):
        os.preadv(fd, [small], rng.randrange(blocks) * BLOCK)
    os.close(fd)
    out["rand_read"] = random_ops * BLOCK / (1 << 20) / (time.perf_counter() - began)
    path.unlink()
    return out


# --- the bench ---------------------------------------------------------------------------------


@dataclass
class Latency:
    operation: str
    n: int
    p50_ms: float
    max_ms: float


@dataclass
class Throughput:
    pattern: str
    volume_mb_s: float
    host_mb_s: float
    ratio: float


async def _timed(samples: list[float], coro: object) -> object:
    began = time.perf_counter()
    result = await coro  # type: ignore[misc]
    samples.append(time.perf_counter() - began)
    return result


async def bench(
    rounds: int, seq_mb: int, random_ops: int
) -> tuple[list[Latency], list[Throughput]]:
    from souk.models.machine import CreateMachine, MachineConfig
    from souk.models.volume import CreateVolume
    from souk.worker.daemon import make_driver, running
    from souk.worker.engine import Engine
    from souk.worker.settings import WorkerSettings
    from tests.support.volumes import sweep

    root = Path(tempfile.mkdtemp(prefix="souk-bench-volumes-"))
    os.chmod(root, 0o755)  # the machine's user reaches the host directory in it
    host_dir = root / "host"
    host_dir.mkdir(mode=0o777)
    os.chmod(host_dir, 0o777)
    size = max(64, seq_mb * 2)
    settings = WorkerSettings(
        name="bench",
        region="bench",
        data_dir=root / "worker",
        cpus=4,
        memory_mb=4096,
        disk_mb=size * (rounds * 2 + 2),
        durable=True,
    )
    created: list[float] = []
    extended: list[float] = []
    snapped: list[float] = []
    try:
        async with running(Engine(settings, make_driver("process", settings))) as engine:
            for i in range(rounds):
                vid = f"vol_bench{i:04d}"
                req = CreateVolume(app="bench", id=vid, name="data", size_mb=size)
                await _timed(created, engine.create_volume(req))
                await _timed(extended, engine.extend_volume(vid, size + 64))
                await _timed(snapped, engine.snapshot_volume(vid))
            out = root / "results.json"
            script = Path(__file__).resolve()
            argv = [sys.executable, str(script), "--workload", "data", str(host_dir), str(out)]
            argv += ["--seq-mb", str(seq_mb), "--random-ops", str(random_ops)]
            config = MachineConfig.model_validate(
                {
                    "init": {"exec": argv},
                    "restart": {"policy": "no"},
                    "mounts": [{"volume": "vol_bench0000", "path": "/data"}],
                }
            )
            os.chmod(root, 0o777)  # the results file is written by the machine's user
            m = await engine.create(CreateMachine(app="bench", config=config))
            _, found = await engine.wait(m.id, "stopped", 600, None)
            if not out.exists():
                log = (settings.rundir(m.id) / "stderr.log").read_text()
                raise RuntimeError(f"the workload failed ({found.state}): {log[-2000:]}")
            figures = json.loads(out.read_text())
            await engine.submit(m.id, "destroy", {"force": True})
            await engine.wait(m.id, "destroyed", 30, None)
            for i in range(rounds):
                await engine.destroy_volume(f"vol_bench{i:04d}")
    finally:
        sweep(settings.data_dir)  # the worker's shared mount of its volumes' directory too
        shutil.rmtree(root, ignore_errors=True)
    latencies = [
        Latency(name, len(xs), pct(xs, 50), max(xs) * 1000)
        for name, xs in (
            (f"create {size} MB", created),
            ("extend +64 MB", extended),
            ("snapshot", snapped),
        )
    ]
    rows = [
        Throughput(
            p, figures["volume"][p], figures["host"][p], figures["volume"][p] / figures["host"][p]
        )
        for p in ("seq_write", "seq_read", "rand_write", "rand_read")
    ]
    return latencies, rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--seq-mb", type=int, default=128)
    parser.add_argument("--random-ops", type=int, default=1000)
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--workload", nargs=3, metavar=("VOLUME", "HOST", "OUT"))
    args = parser.parse_args()
    if args.workload:
        volume, host, out = (Path(a) for a in args.workload)
        results = {
            "volume": workload(volume, args.seq_mb, args.random_ops),
            "host": workload(host, args.seq_mb, args.random_ops),
        }
        out.write_text(json.dumps(results))
        return
    latencies, rows = asyncio.run(bench(args.rounds, args.seq_mb, args.random_ops))
    if args.json:
        print(json.dumps({"latency": [asdict(r) for r in latencies],
                          "throughput": [asdict(r) for r in rows]}, indent=2))  # fmt: skip
        return
    console = Console()
    console.print(machine_info())
    table = Table("operation", "n", "p50 ms", "max ms", title="volume operations")
    for r in latencies:
        table.add_row(r.operation, str(r.n), f"{r.p50_ms:.0f}", f"{r.max_ms:.0f}")
    console.print(table)
    table = Table("pattern", "volume MB/s", "host disk MB/s", "ratio", title="inside a machine")
    for t in rows:
        table.add_row(t.pattern, f"{t.volume_mb_s:.1f}", f"{t.host_mb_s:.1f}", f"{t.ratio:.2f}x")
    console.print(table)


if __name__ == "__main__":
    main()
