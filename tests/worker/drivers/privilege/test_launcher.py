"""souk-launch, and the process driver through it or without it: a machine's command runs as
its app, in its cgroups from its first instruction, and nothing runs that should not."""

from __future__ import annotations

import asyncio
import logging
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import replace
from pathlib import Path

import pytest

from souk.models.machine import MachineConfig
from souk.models.machine_ops import ExecRequest
from souk.worker.daemon import make_driver, running
from souk.worker.drivers import launcher, spawner
from souk.worker.drivers.base import Launch
from souk.worker.drivers.process import ProcessDriver
from souk.worker.engine import Engine
from souk.worker.host.cgroups import ROOT, Cgroups, detect
from souk.worker.settings import WorkerSettings
from tests.support.engines import destroy_all

from .conftest import LOOK, NOBODY, SLEEP, assert_confined, machine, needs_root, pid_of

pytestmark = [pytest.mark.integration, needs_root]


def test_the_launchers_command_line_joins_drops_and_leaves_nothing_open(
    built: str, cgroups: Cgroups
) -> None:
    machine_id = "m" + uuid.uuid4().hex[:12]
    procs = cgroups.prepare(machine_id, 1, 64)
    assert procs
    fds = [os.open(p, os.O_WRONLY) for p in procs]
    flags = [f for fd in fds for f in ("--join", str(fd))]
    argv = [built, *flags, "--ids", f"{NOBODY}:{NOBODY}", "--no-new-privs", "--"]
    argv += ["sh", "-c", f"{LOOK}; exec sleep 30"]
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, pass_fds=fds)
    try:
        for fd in fds:
            os.close(fd)
        assert proc.stdout is not None
        seen = b""
        while not seen.endswith(b"end\n"):
            seen += os.read(proc.stdout.fileno(), 4096)
        while os.readlink(f"/proc/{proc.pid}/exe") != SLEEP:  # sh became it
            time.sleep(0.001)
        inherited = sorted(int(fd) for fd in os.listdir(f"/proc/{proc.pid}/fd"))
    finally:
        proc.kill()
        proc.wait()
        cgroups.remove(machine_id)
    assert_confined(seen.decode(), f"/{cgroups.group}/{machine_id}", NOBODY)
    assert inherited == [0, 1, 2]  # not the cgroups' descriptors


@pytest.mark.parametrize(
    ("flags", "command", "code"),
    [
        (["--bogus", "3"], ["touch", "{ran}"], 125),
        (["--ids", "1"], ["touch", "{ran}"], 125),
        (["--ids", "x:1"], ["touch", "{ran}"], 125),
        (["--join", "2"], ["touch", "{ran}"], 125),
        (["--join", "{readonly}"], ["touch", "{ran}"], 125),  # a join that fails runs nothing
        (["--ids", f"{NOBODY}:{NOBODY}"], [], 125),
        (["--ids", f"{NOBODY}:{NOBODY}"], ["no-such-command-here"], 127),
        (["--ids", f"{NOBODY}:{NOBODY}"], ["/etc/passwd"], 126),
    ],
)
def test_the_launcher_runs_nothing_it_should_not(
    built: str, tmp_path: Path, flags: list[str], command: list[str], code: int
) -> None:
    ran = tmp_path / "ran"
    readonly = os.open("/dev/null", os.O_RDONLY)
    try:
        values = {"ran": str(ran), "readonly": str(readonly)}
        argv = [built, *(f.format(**values) for f in flags), "--"]
        argv += [c.format(**values) for c in command]
        done = subprocess.run(argv, capture_output=True, pass_fds=(readonly,), timeout=10)
    finally:
        os.close(readonly)
    assert done.returncode == code, done.stderr
    assert done.stderr  # says why
    assert not ran.exists()


@pytest.mark.parametrize(
    ("command", "code"),
    [
        (["sh", "-c", "echo out; exit 7"], 7),
        (["sh", "-c", "kill -TERM $$"], 128 + 15),  # as a shell says a signal's end
        (["no-such-command-here"], 127),
    ],
)
def test_the_launcher_records_an_exit_code_once_the_command_ends(
    built: str, tmp_path: Path, command: list[str], code: int
) -> None:
    """The runc driver's shim: the code, written whole (a file renamed into place), outlives
    whoever started it."""
    done = subprocess.run(
        [built, "--exit-to", "exit_code", "--", *command],
        cwd=tmp_path,
        capture_output=True,
        timeout=10,
    )
    assert done.returncode == code
    assert (tmp_path / "exit_code").read_text() == f"{code}\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["exit_code"]
    if code == 7:
        assert done.stdout == b"out\n"  # the command's own output, through


@pytest.mark.parametrize(
    "script", ["#!/bin/sh\necho 1\n", "#!/bin/sh\nexit 125\n", "#!/bin/sh\nsleep 30\n"]
)
def test_a_launcher_that_speaks_another_protocol_is_not_used(
    built: str, tmp_path: Path, script: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A build left from an older souk (other flags), or not a launcher at all: machines then
    start without it rather than fail."""
    monkeypatch.setattr(launcher, "ASK_WAIT", 0.5)
    (tmp_path / "right").mkdir()
    shutil.copy(built, tmp_path / "right" / launcher.NAME)
    assert launcher.find(str(tmp_path / "right")) == str(tmp_path / "right" / launcher.NAME)
    wrong = tmp_path / "wrong" / launcher.NAME
    wrong.parent.mkdir()
    wrong.write_text(script)
    wrong.chmod(0o755)
    assert launcher.find(str(wrong.parent)) is None
    assert launcher.find(str(tmp_path / "none")) is None


@pytest.fixture(params=["launcher", "without"])
async def engine(
    request: pytest.FixtureRequest, worker_settings: WorkerSettings, monkeypatch: pytest.MonkeyPatch
) -> AsyncIterator[Engine]:
    """A root worker's engine spawning through souk-launch, or without it (Python's own change
    of ids, after a fork)."""
    if request.param == "launcher" and launcher.LAUNCHER is None:
        pytest.skip("souk-launch is not built (scripts/setup.sh builds it)")
    if request.param == "without":
        monkeypatch.setattr(launcher, "LAUNCHER", None)
    s = worker_settings
    async with running(Engine(s, make_driver("process", s))) as e:
        try:
            yield e
        finally:
            await destroy_all(e)


async def test_a_machine_and_what_it_execs_run_as_its_app_in_its_groups_from_the_start(
    engine: Engine, worker_settings: WorkerSettings
) -> None:
    m = await engine.create(machine("alpha", ["sh", "-c", f"({LOOK}) > seen; exec sleep 600"]))
    pid = await pid_of(engine, m.id)
    uid = int(engine.store.read.execute("SELECT uid FROM app_users").fetchone()[0])
    seen = Path(f"/proc/{pid}/cwd/seen")
    deadline = time.monotonic() + 10
    while not (seen.exists() and seen.read_text().endswith("end\n")):
        assert time.monotonic() < deadline, "the machine never wrote what it saw"
        await asyncio.sleep(0.01)
    request = ExecRequest(command=["sh", "-c", LOOK])
    group = f"/souk/{worker_settings.name}/{m.id}" if detect() != "none" else None
    for text in (seen.read_text(), (await engine.exec(m.id, request)).stdout):
        assert_confined(text, group, uid)  # no setuid program of the host lifts it back
    if detect() != "none":
        assert limits(f"souk/{worker_settings.name}/{m.id}") == {
            "memory": m.config.guest.memory_mb << 20,
            "cpu": (m.config.guest.cpus * 100_000, 100_000),
        }


def limits(group: str) -> dict[str, object]:
    """The memory and CPU limits the kernel holds for a group, in either hierarchy."""
    if detect() == "v2":
        quota, period = (ROOT / group / "cpu.max").read_text().split()
        memory = (ROOT / group / "memory.max").read_text()
    else:
        quota = (ROOT / "cpu" / group / "cpu.cfs_quota_us").read_text()
        period = (ROOT / "cpu" / group / "cpu.cfs_period_us").read_text()
        memory = (ROOT / "memory" / group / "memory.limit_in_bytes").read_text()
    return {"memory": int(memory), "cpu": (int(quota), int(period))}


@pytest.fixture
async def nothing_to_confine(built: str) -> AsyncIterator[ProcessDriver]:
    """The process driver of a worker with no cgroups to give (nor, below, ids)."""
    groups = Cgroups("souk/none")
    groups.mode, groups.freezer = "none", "none"
    driver = ProcessDriver(groups)
    yield driver
    await driver.close()


async def started(driver: ProcessDriver, tmp_path: Path, script: str, **env: str) -> str:
    """What `script`, started by `driver` as the worker, printed before it ended."""
    config = MachineConfig.model_validate({"init": {"exec": ["sh", "-c", script]}, "env": env})
    launch = Launch("m1", "demo", "mad", "i1", config, "m1.1", tmp_path / "m1", "127.0.0.1")
    launch.rundir.mkdir()
    handle = await driver.spawn(replace(launch, resumed=False))
    assert await asyncio.wait_for(driver.wait("m1"), 10) == 0
    assert handle.pid > 0
    return (launch.rundir / "stdout.log").read_text()


async def test_a_worker_with_nothing_else_to_confine_still_sets_no_new_privs(
    nothing_to_confine: ProcessDriver, tmp_path: Path
) -> None:
    seen = await started(nothing_to_confine, tmp_path, "grep NoNewPrivs /proc/self/status")
    assert seen == "NoNewPrivs:\t1\n"


async def test_a_start_too_large_for_the_server_takes_the_command_line(
    nothing_to_confine: ProcessDriver,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    caplog: pytest.LogCaptureFixture,
) -> None:
    monkeypatch.setattr(spawner, "SEND_BUFFER", 32 << 10)  # the kernel doubles it: 64 KiB
    caplog.set_level(logging.INFO, "souk.worker.process")
    script = "echo ${#BIG}; grep NoNewPrivs /proc/self/status"
    seen = await started(nothing_to_confine, tmp_path, script, BIG="x" * (100 << 10))
    assert seen == f"{100 << 10}\nNoNewPrivs:\t1\n"  # all of it, and confined the same
    assert "started by souk-launch's command line" in caplog.text
