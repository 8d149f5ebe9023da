"""Machine start times from an image: cold (pull + unpack + run), warm (a new machine of a cached
image, named by its tag), pinned (the same, named as a deploy names it, `name:tag@sha256:...`),
again (a stopped machine started again: its version's image, root filesystem and network kept),
warm without souk-init as PID 1 (the image's command is, as before souk-init ran containers),
and a bare `runc run` of the same bundle, as ratios to the bare run. Needs root, runc,
docker-registry and busybox. Run: python bench/image_start.py [--runs N] [--dir DIR]"""

from __future__ import annotations

import argparse
import asyncio
import json
import statistics
import subprocess
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path

import _harness  # noqa: F401  (puts the repository root on the path, for tests.support)

from souk.models.machine import InitConfig, MachineConfig
from souk.worker.drivers.base import Launch
from souk.worker.drivers.runc import RuncDriver
from souk.worker.oci.images import ImageCache
from souk.worker.oci.reference import ImageRef
from souk.worker.oci.registry import RegistryClient
from souk.worker.oci.spec import runtime_spec
from tests.support.images import ImageSpec, busybox_layer, layer, push_image
from tests.support.registry import running_registry

SLEEP = ["/bin/sleep", "60"]


def new_launch(work: Path, image: str, n: int) -> Launch:
    machine_id = uuid.uuid4().hex[:12]
    rundir = work / "machines" / machine_id
    rundir.mkdir(parents=True)
    config = MachineConfig(image=image, init=InitConfig(exec=SLEEP))
    ip = f"10.214.0.{n}"
    return Launch(machine_id, "bench", "local", "i", config, uuid.uuid4().hex, rundir, ip)


async def timed_start(driver: RuncDriver, launch: Launch) -> tuple[float, str | None]:
    """How long prepare and spawn took, and the image digest prepared; the machine is then
    stopped, as a stop leaves it (not cleaned up)."""
    began = time.perf_counter()
    digest = await driver.prepare(launch)
    handle = await driver.spawn(launch)
    took = time.perf_counter() - began
    await driver.stop(launch.machine_id, handle, "SIGKILL", 1.0)
    return took, digest


async def start_machine(driver: RuncDriver, work: Path, image: str, n: int) -> float:
    launch = new_launch(work, image, n)
    took, _ = await timed_start(driver, launch)
    await driver.cleanup(launch)
    return took


async def start_again(driver: RuncDriver, work: Path, image: str, n: int) -> float:
    """A stopped machine started again, as the worker does it (what the proxy asks for when a
    request finds an app scaled to zero): the image its first start found, by digest, and the
    root filesystem and network that a stop leaves in place."""
    launch = new_launch(work, image, n)
    _, digest = await timed_start(driver, launch)
    again = replace(launch, marker=uuid.uuid4().hex, image_digest=digest)
    took, _ = await timed_start(driver, again)
    await driver.cleanup(again)
    return took


def bare_run(runc: str, state: Path, bundle: Path) -> float:
    cid = f"bare-{uuid.uuid4().hex[:8]}"
    began = time.perf_counter()
    run = [runc, "--root", str(state), "run", "--detach", "--bundle", str(bundle), cid]
    subprocess.run(run, check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    took = time.perf_counter() - began
    subprocess.run([runc, "--root", str(state), "delete", "--force", cid], check=True)
    return took


async def main(runs: int, where: Path | None = None) -> None:
    with tempfile.TemporaryDirectory(prefix="souk-bench-", dir=where) as tmp:
        work = Path(tmp)
        with running_registry(work / "registry", access_log=False) as registry:
            host, config = registry.host, registry.config()
            async with RegistryClient(config) as client:
                spec = ImageSpec([layer(busybox_layer().bytes())], cmd=SLEEP)
                await push_image(client, ImageRef(host, "bench", "1"), spec)
            image = f"{host}/bench:1"
            cold, warm, pinned, again, no_init, bare = [], [], [], [], [], []
            for i in range(runs):
                cache = ImageCache(work / f"cache-{i}", RegistryClient(config))
                driver = RuncDriver(cache, work / "runc")
                if driver.init is None:
                    raise SystemExit("souk-init is not built: scripts/setup.sh builds it")
                plain = RuncDriver(cache, work / "runc", use_init=False)
                cold.append(await start_machine(driver, work, image, 5 * i + 2))
                warm.append(await start_machine(driver, work, image, 5 * i + 3))
                no_init.append(await start_machine(plain, work, image, 5 * i + 6))
                deployed = await cache.resolve(image)  # once per release, not per machine
                pinned.append(await start_machine(driver, work, deployed, 5 * i + 4))
                again.append(await start_again(driver, work, image, 5 * i + 5))
                # The bare run: the same image's bundle, already prepared, started by runc alone.
                pulled = await cache.pull(image)
                bundle = work / f"bare-{i}"
                rootfs = await cache.prepare_rootfs(pulled, bundle / "image")
                machine = MachineConfig(image=image, init=InitConfig(exec=SLEEP))
                doc = runtime_spec(
                    pulled.config,
                    machine,
                    rootfs.resolve(),
                    "bare",
                    {},
                    None,
                    f"/souk-bench/{i}",
                    {},
                )
                (bundle / "config.json").write_text(json.dumps(doc))
                bare.append(bare_run(driver.runc, work / "runc-bare", bundle))
                await cache.release_rootfs(bundle / "image")
                await cache.client.close()
    base = statistics.median(bare)
    print(f"{'':>7} {'median ms':>10} {'x bare runc run':>16}")
    rows = (
        ("cold", cold),
        ("warm", warm),
        ("no-init", no_init),
        ("pinned", pinned),
        ("again", again),
        ("bare", bare),
    )
    for name, values in rows:
        m = statistics.median(values)
        print(f"{name:>7} {m * 1000:>10.1f} {m / base:>16.2f}")
    ratio = statistics.median(warm) / statistics.median(no_init)
    print(f"warm with souk-init as PID 1 / without: {ratio:.2f}x")


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument(
        "--dir",
        type=Path,
        help="where the image cache, the bundles and the registry live (default: system temp); "
        "the disk a worker would use, or tmpfs to leave the disk out",
    )
    args = parser.parse_args()
    asyncio.run(main(args.runs, args.dir))
