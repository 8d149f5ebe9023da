"""souk-init as PID 1 of runc containers: several processes in one container, each restarted by
its own policy, orphans reaped, the stop signal passed to every process, the first exit's code
the machine's."""

from __future__ import annotations

import os
import shutil
from dataclasses import replace
from pathlib import Path

import pytest

from souk.models.machine import (
    CreateMachine,
    InitConfig,
    MachineConfig,
    MachineProcess,
    RestartConfig,
)
from souk.worker.daemon import make_driver, running
from souk.worker.drivers.base import Drivers
from souk.worker.drivers.runc import RuncDriver
from souk.worker.engine import Engine
from souk.worker.host import procfs
from souk.worker.machines import admission
from souk.worker.oci.registry import RegistryClient
from tests.support.engines import destroy_all, settings
from tests.support.images import ImageSpec, Layer
from tests.support.registry import Registry, push
from tests.support.waiting import eventually
from tests.worker.oci.conftest import launch

pytestmark = pytest.mark.skipif(shutil.which("runc") is None, reason="runc is not installed")

# Each loops until the stop signal, which it reports before it exits.
WEB = (
    "trap 'echo web got TERM; exit 0' TERM; echo web up; touch /tmp/web;"
    " while :; do sleep 0.1; done"
)
AFTER_WEB = "while [ ! -e /tmp/web ]; do sleep 0.05; done; "  # its trap is set by then
# Fails its first run (the container's /tmp keeps a mark), then runs as `WEB` does; its orphan,
# a background sleep whose parent exits at once, is left to PID 1 to reap.
FLAKY = (
    "if [ ! -e /tmp/failed ]; then touch /tmp/failed; echo flaky fails; exit 3; fi;"
    " (sleep 2 &); trap 'echo flaky got TERM; exit 0' TERM; echo flaky up;"
    " while :; do sleep 0.1; done"
)


def _sh(script: str) -> list[str]:
    return ["/bin/sh", "-c", script]


def _log(path: Path) -> list[str]:
    return (path / "stdout.log").read_text().splitlines()


def _zombies(pids: list[int]) -> list[int]:
    found = []
    for pid in pids:
        try:
            stat = Path(f"/proc/{pid}/stat").read_text()
        except OSError:
            continue
        if stat[stat.rindex(")") + 2] == "Z":
            found.append(pid)
    return found


async def _image(client: RegistryClient, registry: Registry, base: Layer, tag: str) -> str:
    await push(client, registry, tag, ImageSpec([base], env=["PATH=/bin"]))
    return f"{registry.host}/{tag}"


async def test_two_processes_one_restarted_by_its_policy_both_stopped(
    registry: Registry,
    client: RegistryClient,
    busybox_base: Layer,
    driver: RuncDriver,
    tmp_path: Path,
) -> None:
    config = MachineConfig(
        image=await _image(client, registry, busybox_base, "two:1"),
        restart=RestartConfig(policy="no"),  # the machine's: not the flaky one's
        processes=[
            MachineProcess(exec=_sh(WEB)),
            MachineProcess(
                exec=_sh(FLAKY), restart=RestartConfig(policy="on-failure", max_retries=2)
            ),
        ],
    )
    machine = launch(tmp_path, config, "10.213.8.2")
    await driver.prepare(machine)
    handle = await driver.spawn(machine)
    mid = machine.machine_id
    try:
        await eventually(lambda: {"flaky up", "web up"} <= set(_log(machine.rundir)))
        lines = _log(machine.rundir)
        assert lines.count("web up") == 1 and lines.count("flaky fails") == 1
        # both run in the one container, under souk-init (ps sees all three)
        pids = await driver.processes(mid, handle)
        commands = {tuple(procfs.arguments(pid) or []) for pid in pids}
        assert (b"/.souk/init", b"--container") in commands
        assert (b"/bin/sh", b"-c", WEB.encode()) in commands
        assert (b"/bin/sh", b"-c", FLAKY.encode()) in commands
        assert handle.pid in pids
        # the orphan the flaky one left is souk-init's, which reaps it once it exits
        (orphan,) = [p for p in pids if procfs.arguments(p) == [b"sleep", b"2"]]
        assert orphan in procfs.children(handle.pid)
        await eventually(lambda: not Path(f"/proc/{orphan}").exists())
        assert _zombies(await driver.processes(mid, handle)) == []

        # the stop signal reaches both; they exit 0, the first one's code is the machine's
        await driver.stop(mid, handle, "SIGTERM", 10.0)
        assert await driver.wait(mid) == 0
        lines = _log(machine.rundir)
        assert "web got TERM" in lines and "flaky got TERM" in lines
        assert lines.count("web up") == 1  # never restarted
        assert not procfs.is_alive(handle.pid, handle.pid_start)
    finally:
        await driver.cleanup(machine)


async def test_a_process_that_ends_for_good_ends_the_machine_with_its_code(
    registry: Registry,
    client: RegistryClient,
    busybox_base: Layer,
    driver: RuncDriver,
    tmp_path: Path,
) -> None:
    """Without a policy of its own a process takes the machine's (on-failure, 1 retry here):
    it fails twice, then the machine ends with its code, the other process told to stop."""
    config = MachineConfig(
        image=await _image(client, registry, busybox_base, "ends:1"),
        restart=RestartConfig(policy="on-failure", max_retries=1),
        processes=[
            MachineProcess(exec=_sh(WEB)),
            MachineProcess(exec=_sh(AFTER_WEB + "echo try; exit 7")),
        ],
    )
    machine = launch(tmp_path, config, "10.213.8.3")
    await driver.prepare(machine)
    try:
        await driver.spawn(machine)
        assert await driver.wait(machine.machine_id) == 7
        lines = _log(machine.rundir)
        assert lines.count("try") == 2 and "web got TERM" in lines
    finally:
        await driver.cleanup(machine)


async def test_always_restarts_a_process_that_succeeds_until_the_stop(
    registry: Registry,
    client: RegistryClient,
    busybox_base: Layer,
    driver: RuncDriver,
    tmp_path: Path,
) -> None:
    """`always` restarts a process that exits 0 (after a pause that grows), and a stop ends
    the machine whether that process runs or waits for its restart."""
    config = MachineConfig(
        image=await _image(client, registry, busybox_base, "always:1"),
        processes=[
            MachineProcess(exec=_sh(WEB)),
            MachineProcess(
                exec=_sh(AFTER_WEB + "echo tick"), restart=RestartConfig(policy="always")
            ),
        ],
    )
    machine = launch(tmp_path, config, "10.213.8.6")
    await driver.prepare(machine)
    handle = await driver.spawn(machine)
    try:
        await eventually(lambda: _log(machine.rundir).count("tick") >= 3)
        await driver.stop(machine.machine_id, handle, "SIGTERM", 10.0)
        assert await driver.wait(machine.machine_id) == 0  # ended by souk-init, not killed
        assert "web got TERM" in _log(machine.rundir)
        assert not procfs.is_alive(handle.pid, handle.pid_start)
    finally:
        await driver.cleanup(machine)


async def test_ids_capabilities_and_a_signal_that_is_not_a_stop(
    registry: Registry,
    client: RegistryClient,
    busybox_base: Layer,
    driver: RuncDriver,
    tmp_path: Path,
) -> None:
    """Each process runs as its own ids; souk-init's own capabilities (to give ids) reach no
    process, root's included; `signal` reaches the processes and stops nothing."""
    caps = "grep -E '^Cap(Bnd|Eff)' /proc/self/status"
    trap, loop = "trap 'echo got HUP' HUP", "echo ready; while :; do sleep 0.1; done"
    config = MachineConfig(
        image=await _image(client, registry, busybox_base, "ids:1"),
        init=InitConfig(exec=_sh(f"{trap}; echo root $(id -u):$(id -g); {caps}; {loop}")),
        processes=[
            MachineProcess(),  # init's command
            MachineProcess(user="1000", exec=_sh(f"{trap}; echo user $(id -u):$(id -g); {loop}")),
        ],
    )
    machine = launch(tmp_path, config, "10.213.8.4")
    await driver.prepare(machine)
    handle = await driver.spawn(machine)
    mid = machine.machine_id
    try:
        await eventually(lambda: _log(machine.rundir).count("ready") == 2)  # traps set
        lines = _log(machine.rundir)
        assert "root 0:0" in lines and "user 1000:1000" in lines
        # CAP_KILL, CAP_NET_BIND_SERVICE, CAP_AUDIT_WRITE: the container's, not souk-init's
        mask = f"{(1 << 5) | (1 << 10) | (1 << 29):016x}"
        assert f"CapBnd:\t{mask}" in lines and f"CapEff:\t{mask}" in lines

        await driver.signal(mid, handle, "SIGHUP")
        await eventually(lambda: _log(machine.rundir).count("got HUP") == 2)
        assert procfs.is_alive(handle.pid, handle.pid_start)
        # exec runs as the image's process would have: root, its env, not souk-init's caps
        out = await driver.exec(machine, handle, _sh(f"id -u; {caps}"), b"", 10)
        assert out.stdout.decode().splitlines() == ["0", f"CapEff:\t{mask}", f"CapBnd:\t{mask}"]
    finally:
        await driver.stop(mid, handle, "SIGKILL", 1.0)
        await driver.cleanup(machine)


async def test_many_processes_with_large_environments_all_run(
    registry: Registry,
    client: RegistryClient,
    busybox_base: Layer,
    driver: RuncDriver,
    tmp_path: Path,
) -> None:
    """The API's most processes, each with a thousand variables of the machine's: nothing of
    the config is cut short on its way to souk-init."""
    config = MachineConfig(
        image=await _image(client, registry, busybox_base, "many:1"),
        env={f"V{i}": str(i) for i in range(1000)},
        processes=[
            MachineProcess(exec=_sh(f"echo p{n} $V999 $OWN; exec sleep 600"), env={"OWN": "x"})
            for n in range(32)
        ],
    )
    machine = launch(tmp_path, config, "10.213.8.5")
    await driver.prepare(machine)
    handle = await driver.spawn(machine)
    try:
        want = {f"p{n} 999 x" for n in range(32)}
        await eventually(lambda: want <= set(_log(machine.rundir)))
    finally:
        await driver.stop(machine.machine_id, handle, "SIGKILL", 1.0)
        await driver.cleanup(machine)


def test_a_runc_worker_admits_processes_of_images(driver: RuncDriver, tmp_path: Path) -> None:
    config = MachineConfig.model_validate(
        {"image": "r.example/a:1", "processes": [{"cmd": ["a"]}, {"cmd": ["b"]}]}
    )
    s = settings(tmp_path)
    with_init = Drivers(command=driver, image=driver)
    admission.check_runnable(with_init, s, config)
    without = RuncDriver(driver.images, driver.state_dir, driver.cgroup_parent, use_init=False)
    with pytest.raises(Exception, match="runs no processes of images"):
        admission.check_runnable(Drivers(command=without, image=without), s, config)


@pytest.mark.skipif(os.geteuid() != 0, reason="only a root worker gives apps ids of their own")
async def test_processes_of_an_app_in_its_user_namespace_through_the_worker(
    registry: Registry, client: RegistryClient, busybox_base: Layer, tmp_path: Path
) -> None:
    """A root worker's container has a user namespace of the app's ids: each process runs as
    the app's host id + its `user`, under souk-init."""
    image = await _image(client, registry, busybox_base, "duo:1")
    s = replace(settings(tmp_path), insecure_registries=(registry.host,))
    config = MachineConfig.model_validate(
        {
            "image": image,
            "processes": [
                {"exec": _sh("echo root up; exec sleep 600")},
                {"exec": _sh("echo user up; exec sleep 600"), "user": "1000"},
            ],
        }
    )
    async with running(Engine(s, make_driver("process", s))) as engine:
        try:
            m = await engine.create(CreateMachine(app="duo", config=config))
            ok, found = await engine.wait(m.id, "started", 15, None)
            assert ok, found.state
            log = s.rundir(m.id)
            await eventually(lambda: {"root up", "user up"} <= set(_log(log)))
            row = engine.store.read.execute("SELECT pid FROM machines WHERE id = ?", (m.id,))
            init = int(row.fetchone()["pid"])
            (app_uid,) = engine.store.read.execute(
                "SELECT uid FROM app_users WHERE app = 'duo'"
            ).fetchone()
            uids = sorted(_host_uid(pid) for pid in procfs.children(init))
            assert uids == [app_uid, app_uid + 1000]
            assert _host_uid(init) == app_uid  # souk-init: the container's root
            pids = await engine.pids(m.id)
            assert init in pids and len(pids) == 3
        finally:
            await destroy_all(engine)


def _host_uid(pid: int) -> int:
    status = Path(f"/proc/{pid}/status").read_text().splitlines()
    return int(next(x for x in status if x.startswith("Uid:")).split()[1])
