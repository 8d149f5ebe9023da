"""One guest with two processes, through the worker's engine: its own kernel, its network, its
files, suspend and resume, a worker killed and its successor adopting the guest, stop, start
and destroy. The tests share the guest, in order (booting one under TCG takes seconds)."""

from __future__ import annotations

import asyncio
import base64
import os
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import pytest
import pytest_asyncio

from souk.models.machine import CreateMachine, Machine, MachineConfig
from souk.models.machine_ops import ExecRequest
from souk.worker.daemon import make_driver, running
from souk.worker.drivers import vm_boot
from souk.worker.drivers.vm import VmDriver
from souk.worker.engine import Engine
from souk.worker.host import procfs
from souk.worker.host.cgroups import Cgroups
from souk.worker.oci import network
from souk.worker.settings import WorkerSettings
from tests.support.engines import destroy_all

pytestmark = [
    pytest.mark.integration,
    pytest.mark.asyncio(loop_scope="module"),
    pytest.mark.timeout(600),  # the module's guest boots in its first test's setup
]

SECRET = b"only-for-the-guest\n"
COUNTER = "i=0; while true; do i=$((i+1)); echo $i > /tmp/count; sleep 0.2; done"


@dataclass
class Guest:
    engine: Engine
    machine: Machine
    settings: WorkerSettings

    async def run(self, *argv: str) -> tuple[int, str, str]:
        out = await self.engine.exec(self.machine.id, ExecRequest(command=list(argv), timeout=60))
        return out.exit_code, out.stdout, out.stderr

    def pid(self) -> int:
        row = self.engine.store.read.execute(
            "SELECT pid FROM machines WHERE id = ?", (self.machine.id,)
        ).fetchone()
        return int(row[0])

    async def count(self) -> int:
        """The counter's last value (it writes its first a moment after the guest starts)."""
        for _ in range(100):
            code, out, _ = await self.run("cat", "/tmp/count")
            if code == 0 and out.strip():
                return int(out)
            await asyncio.sleep(0.1)
        raise AssertionError("the counter wrote nothing")


@pytest_asyncio.fixture(scope="module", loop_scope="module")
async def guest(vm_settings: WorkerSettings, busybox_image: str) -> AsyncIterator[Guest]:
    config = MachineConfig.model_validate(
        {
            "image": busybox_image,
            "guest": {"cpus": 1, "memory_mb": 256},
            "processes": [
                {"cmd": ["sh", "-c", COUNTER]},
                {"cmd": ["httpd", "-f", "-p", "8080", "-h", "/www"]},
            ],
            "files": [
                {
                    "guest_path": "/etc/souk-secret",
                    "raw_value": base64.b64encode(SECRET).decode(),
                    "mode": 0o600,
                }
            ],
            "restart": {"policy": "no"},
        }
    )
    engine = Engine(vm_settings, make_driver("vm", vm_settings))
    await engine.recover()
    machine = await engine.create(CreateMachine(app="web", config=config))
    found = Guest(engine, machine, vm_settings)
    try:
        ok, started = await engine.wait(machine.id, "started", 240, None)
        assert ok, (started.state, (vm_settings.rundir(machine.id) / "console.log").read_text())
        yield found
    finally:
        async with running(found.engine) as last:
            await destroy_all(last)


async def test_the_machine_runs_on_a_kernel_of_its_own(guest: Guest) -> None:
    code, release, _ = await guest.run("uname", "-r")
    kernel = vm_boot.find_kernel()
    assert kernel is not None and code == 0
    assert release.strip() == kernel.release != os.uname().release
    assert guest.engine.capacity().vm in ("kvm", "tcg")
    qemu = procfs.program(guest.pid()) or ""
    assert qemu.endswith(vm_boot.QEMU)
    status = Path(f"/proc/{guest.pid()}/status").read_text()
    uid = int(status.split("\nUid:")[1].split()[0])
    assert uid != 0  # qemu runs as the app's host user...
    assert "\nSeccomp:\t2" in status  # ...inside its own sandbox


async def test_two_processes_run_in_one_guest_on_the_machines_address(guest: Guest) -> None:
    driver = guest.engine.drivers.image
    assert isinstance(driver, VmDriver)
    handle = guest.engine.supervisor.handle(guest.machine.id)
    names = [line.split()[1] for line in await driver.guest_processes(guest.machine.id, handle)]
    assert names[0] == "init" and {"sh", "httpd"} <= set(names)
    assert "kthreadd" not in names  # the machine's processes, not the kernel's threads
    first = await guest.count()
    await asyncio.sleep(0.5)
    assert await guest.count() > first  # the counter runs...
    address = guest.machine.private_ip or ""
    assert ":" in address  # on the private network, as every other machine
    url = f"http://[{address}]:8080/index.html"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=5)) as http:
        for _ in range(100):
            try:
                async with http.get(url) as resp:
                    assert await resp.text() == "hello from a guest\n"  # ...and so does httpd
                    break
            except (aiohttp.ClientConnectionError, TimeoutError):
                await asyncio.sleep(0.1)
        else:
            raise AssertionError(f"nothing answered at {url}")


async def test_the_guest_sees_its_files_not_the_hosts(guest: Guest, tmp_path: Path) -> None:
    assert await guest.run("cat", "/etc/souk-secret") == (0, SECRET.decode(), "")
    _, cmdline, _ = await guest.run("cat", "/proc/cmdline")
    assert SECRET.decode().strip() not in cmdline  # the config came over the channel
    host_file = tmp_path / "host-only"
    host_file.write_text("host")
    code, _, _ = await guest.run("cat", str(host_file))
    assert code != 0
    assert (await guest.run("cat", "/proc/1/comm"))[1] == "init\n"  # souk-init, not the host's
    _, seen, _ = await guest.run("cat", f"/proc/{os.getpid()}/cmdline")
    assert "pytest" not in seen  # the host's processes are not the guest's
    assert (await guest.run("cat", "/proc/sys/kernel/hostname"))[1].strip() == guest.machine.id


def guest_memory_kb(pid: int) -> int:
    """What of qemu's memory is the guest's RAM (a memfd: shared memory)."""
    status = Path(f"/proc/{pid}/status").read_text()
    return int(status.split("\nRssShmem:")[1].split()[0])


async def test_suspend_saves_memory_frees_it_and_resume_goes_on(guest: Guest) -> None:
    engine, machine_id, pid = guest.engine, guest.machine.id, guest.pid()
    before = await guest.count()
    held = guest_memory_kb(pid)
    assert held > 8 << 10  # the guest's kernel and processes, in the host's memory
    await engine.submit(machine_id, "suspend", {})
    assert (await engine.wait(machine_id, "suspended", 120, None))[0]
    snapshot = guest.settings.rundir(machine_id) / "memory.snap"
    assert snapshot.stat().st_blocks * 512 > 8 << 20  # the guest's memory, on disk...
    assert snapshot.stat().st_mode & 0o777 == 0o600
    assert guest_memory_kb(pid) < held // 8  # ...and no longer in the host's
    await engine.submit(machine_id, "resume", {})
    assert (await engine.wait(machine_id, "started", 60, None))[0]
    after = await guest.count()
    assert after >= before  # the shell's counter went on from where it was, not from 1
    assert guest.pid() == pid and not snapshot.exists()
    await asyncio.sleep(0.5)
    assert await guest.count() > after  # it runs on


async def test_a_restarted_worker_adopts_the_running_guest(guest: Guest) -> None:
    pid, before = guest.pid(), await guest.count()
    await guest.engine.close()  # the worker dies; the guest lives on
    guest.engine = Engine(guest.settings, make_driver("vm", guest.settings))
    await guest.engine.recover()
    assert (await guest.engine.wait(guest.machine.id, "started", 30, None))[0]
    assert guest.pid() == pid
    assert await guest.count() > before  # its channel found again: exec answers


async def test_stop_start_and_destroy(guest: Guest) -> None:
    engine, machine_id, pid = guest.engine, guest.machine.id, guest.pid()
    await engine.submit(machine_id, "stop", {"signal": "SIGTERM", "timeout": 60})
    assert (await engine.wait(machine_id, "stopped", 90, None))[0]
    assert not procfs.is_alive(pid, procfs.start_time(pid) or "")
    # the signal reached the guest's processes (through its channel, found again after the
    # worker's restart): a shell's 128 + 15, not qemu killed at the timeout
    assert engine.get(machine_id, events=False).exit_code == 143
    await engine.submit(machine_id, "start", {})
    assert (await engine.wait(machine_id, "started", 240, None))[0]
    assert guest.pid() != pid
    assert await guest.run("cat", "/etc/souk-secret") == (0, SECRET.decode(), "")
    pid = guest.pid()
    await engine.submit(machine_id, "destroy", {"force": True})
    assert (await engine.wait(machine_id, "destroyed", 60, None))[0]
    assert procfs.start_time(pid) is None
    assert not (network.NETNS_DIR / network.names(machine_id)[0]).exists()
    assert not Cgroups(f"souk/{guest.settings.name}").pids(machine_id)
