"""The vm driver's figures, as ratios measured in one run: create+start through the worker
(prepare, qemu, the guest's `started`) over a bare qemu boot of the same kernel, initramfs and
disk to the guest init's `started` (the same qemu command line, the config sent by hand, no
worker); qemu's memory beyond what its guest uses; suspend and resume times; guests started
per second with several at once (and per bare boot's time). Under TCG (no KVM) every figure
is emulation: only the ratios mean anything. Needs root, qemu, a kernel under /boot,
souk-init and docker-registry.
Run: python bench/vm_start.py [--runs N] [--parallel N] [--dir DIR]"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import subprocess
import tempfile
import time
from dataclasses import replace
from pathlib import Path

import _harness  # noqa: F401  (puts the repository root on the path, for tests.support)

from souk.models.machine import CreateMachine, MachineConfig
from souk.models.machine_ops import ExecRequest
from souk.worker.daemon import make_driver, running
from souk.worker.drivers import vm_guest
from souk.worker.drivers.vm import VmDriver
from souk.worker.drivers.vm_channel import Channel
from souk.worker.engine import Engine
from tests.support.engines import destroy_all, settings
from tests.support.images import ImageSpec, busybox_layer, layer
from tests.support.registry import push, running_registry

BOOT = 600.0


async def worker_start(engine: Engine, image: str) -> tuple[float, str]:
    began = time.perf_counter()
    machine = await engine.create(CreateMachine(app="bench", config=MachineConfig(image=image)))
    ok, found = await engine.wait(machine.id, "started", BOOT, None)
    if not ok:
        raise RuntimeError(f"not started: {found.state}")
    return time.perf_counter() - began, machine.id


async def bare_boot(engine: Engine, machine_id: str) -> float:
    """The machine's own qemu command line, run again by hand in a copy of its directory."""
    driver = engine.drivers.image
    assert isinstance(driver, VmDriver)
    rundir = engine.settings.rundir(machine_id)
    launch = engine._launch_of(engine.store.read.execute(
        "SELECT * FROM machines WHERE id = ?", (machine_id,)).fetchone())  # fmt: skip
    image = await driver.images.pull(launch.config.image or "")
    config = vm_guest.config_frame(
        driver.images, launch, image, ""
    )  # no network: a bare boot has none
    bare = rundir.parent / f"{machine_id}-bare"
    bare.mkdir(exist_ok=True)
    shutil.copyfile(rundir / "root.qcow2", bare / "root.qcow2")
    argv = driver._argv(launch)
    at = argv.index("-netdev")
    del argv[at : at + 4]  # no network: a bare boot has none made for it
    began = time.perf_counter()
    qemu = subprocess.Popen(  # noqa: ASYNC220 (its start is what is timed)
        argv, cwd=bare, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL
    )
    try:
        channel = await Channel.connect_in(bare, "ctl.sock", 30)
        await channel.send(b"C", config)
        await asyncio.wait_for(channel.ready, BOOT)
        took = time.perf_counter() - began
        await channel.close()
    finally:
        qemu.kill()
        qemu.wait()
        shutil.rmtree(bare, ignore_errors=True)
    return took


def rss_kb(pid: int) -> int:
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


async def overhead_mb(engine: Engine, machine_id: str) -> float:
    """qemu's resident memory beyond what the guest itself uses (its MemTotal - MemFree)."""
    out = await engine.exec(machine_id, ExecRequest(command=["cat", "/proc/meminfo"]))
    info = {line.split(":")[0]: int(line.split()[1]) for line in out.stdout.splitlines()}
    used = info["MemTotal"] - info["MemFree"]
    pid = engine.store.read.execute(
        "SELECT pid FROM machines WHERE id = ?", (machine_id,)
    ).fetchone()[0]
    return (rss_kb(pid) - used) / 1024


def guest_ram_mb(engine: Engine, machine_id: str) -> float:
    """What of qemu's memory is its guest's RAM (a memfd, shared memory): what suspend frees."""
    pid = engine.store.read.execute(
        "SELECT pid FROM machines WHERE id = ?", (machine_id,)
    ).fetchone()[0]
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("\nRssShmem:")[1].split()[0]) / 1024


async def suspend_resume(engine: Engine, machine_id: str) -> tuple[float, float, float, float]:
    """Suspend and resume times, and the guest's RAM in the host's memory before and while
    suspended."""
    running_mb = guest_ram_mb(engine, machine_id)
    began = time.perf_counter()
    await engine.submit(machine_id, "suspend", {})
    assert (await engine.wait(machine_id, "suspended", BOOT, None))[0]
    suspended = time.perf_counter() - began
    suspended_mb = guest_ram_mb(engine, machine_id)
    began = time.perf_counter()
    await engine.submit(machine_id, "resume", {})
    assert (await engine.wait(machine_id, "started", BOOT, None))[0]
    return suspended, time.perf_counter() - began, running_mb, suspended_mb


async def main(runs: int, parallel: int, root: Path) -> dict[str, object]:
    with running_registry(root / "registry") as registry:
        async with registry.client() as client:
            spec = ImageSpec([layer(busybox_layer().bytes())], cmd=["sleep", "3600"])
            await push(client, registry, "bench:1", spec)
        image = f"{registry.host}/bench:1"
        s = replace(settings(root), insecure_registries=(registry.host,))
        async with running(Engine(s, make_driver("vm", s))) as engine:
            ratios, overheads, suspends, resumes, bares = [], [], [], [], []
            ram: list[tuple[float, float]] = []
            for _ in range(runs):
                took, machine_id = await worker_start(engine, image)
                bare = await bare_boot(engine, machine_id)
                ratios.append(took / bare)
                bares.append(bare)
                overheads.append(await overhead_mb(engine, machine_id))
                suspended, resumed, running_mb, suspended_mb = await suspend_resume(
                    engine, machine_id
                )
                ram.append((running_mb, suspended_mb))
                suspends.append(suspended / bare)
                resumes.append(resumed / bare)
                await destroy_all(engine)
            began = time.perf_counter()
            await asyncio.gather(*(worker_start(engine, image) for _ in range(parallel)))
            per_second = parallel / (time.perf_counter() - began)
            await destroy_all(engine)
            return {
                "accel": engine.drivers.vm,
                "create_start_over_bare": ratios,
                "qemu_overhead_mb": overheads,
                "suspend_over_bare_boot": suspends,
                "resume_over_bare_boot": resumes,
                "guest_ram_mb_running_then_suspended": ram,
                # under TCG a rate is of emulation: given per bare boot's time as well
                "guests_started_per_second": per_second,
                "guests_started_per_bare_boot": per_second * min(bares),
                "parallel": parallel,
            }


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=2)
    parser.add_argument("--parallel", type=int, default=2)
    parser.add_argument("--dir", type=Path, default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(dir=args.dir) as work:
        found = asyncio.run(main(args.runs, args.parallel, Path(work)))
    print(json.dumps(found, indent=2))
