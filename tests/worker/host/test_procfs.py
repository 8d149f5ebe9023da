"""Finding a machine's processes by the marker in their environment, wherever it stands in it."""

from __future__ import annotations

import os
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from souk.worker.drivers.process import ProcessDriver
from souk.worker.host import procfs
from souk.worker.host.cgroups import Cgroups
from tests.support.waiting import wait_until


@pytest.fixture
def sleepers() -> Iterator[list[subprocess.Popen[bytes]]]:
    started: list[subprocess.Popen[bytes]] = []
    yield started
    for proc in started:
        proc.kill()
        proc.wait()


def spawn(sleepers: list[subprocess.Popen[bytes]], env: dict[str, str]) -> int:
    proc = subprocess.Popen(["sleep", "60"], env=env)
    sleepers.append(proc)
    # Once its exec has laid out the new environment: a vfork's parent may run on before.
    environ = Path(f"/proc/{proc.pid}/environ")
    wait_until(lambda: environ.read_bytes() != b"", what="exec'd")
    return proc.pid


def test_a_machines_processes_are_found_by_their_marker_and_no_other(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    """The marker first, between others or last in the environment; never an id that only
    starts like the machine's, nor the marker's text inside another variable's value."""
    m = "m-" + "0123456789"
    envs = {
        "first": {"SOUK_MACHINE_ID": m, "PATH": "/usr/bin:/bin"},
        "inner": {"PATH": "/usr/bin:/bin", "SOUK_MACHINE_ID": m, "X": "1"},
        "last": {"PATH": "/usr/bin:/bin", "SOUK_MACHINE_ID": m},
        "longer id": {"PATH": "/usr/bin:/bin", "SOUK_MACHINE_ID": m + "0"},
        "in a value": {"PATH": "/usr/bin:/bin", "NOTE": f"SOUK_MACHINE_ID={m}"},
        "none": {"PATH": "/usr/bin:/bin"},
    }
    pids = {name: spawn(sleepers, env) for name, env in envs.items()}
    found = set(procfs.processes_of(m))
    assert found == {pids["first"], pids["inner"], pids["last"]}
    assert set(procfs.processes_of(m + "0")) == {pids["longer id"]}
    sleepers[0].kill()
    sleepers[0].wait()
    assert set(procfs.processes_of(m)) == {pids["inner"], pids["last"]}


async def test_a_machines_processes_are_looked_for_in_its_groups_and_where_they_are_born(
    sleepers: list[subprocess.Popen[bytes]], cgroups: Cgroups
) -> None:
    """One process of the machine in its groups, as a started one is; one still in the worker's
    own group, as one is whose groups could not be made. Both are its; another machine's process
    beside them is not; and the one in the machine's groups is not among the worker's."""
    machine_id = "m" + uuid.uuid4().hex[:12]
    marked = {"PATH": "/usr/bin:/bin", "SOUK_MACHINE_ID": machine_id}
    moved = spawn(sleepers, marked)
    procs = cgroups.prepare(machine_id, 1, 64)
    assert procs
    for path in procs:
        path.write_text(str(moved))
    born = spawn(sleepers, marked)
    spawn(sleepers, {**marked, "SOUK_MACHINE_ID": machine_id + "0"})
    try:
        assert await ProcessDriver(cgroups).remaining(machine_id, None) == sorted([moved, born])
        outside = cgroups.outside()
        assert outside is not None and born in outside and moved not in outside
    finally:
        for proc in sleepers:
            proc.kill()
            proc.wait()
        cgroups.remove(machine_id)


def test_children_are_found_until_reaped_and_name_their_program(
    sleepers: list[subprocess.Popen[bytes]],
) -> None:
    proc = subprocess.Popen(["sleep", "60"])
    sleepers.append(proc)
    wait_until(lambda: os.path.basename(procfs.program(proc.pid) or "") == "sleep", 5, "exec")
    # laid out by its exec a moment after the program changed
    wait_until(lambda: procfs.arguments(proc.pid) == [b"sleep", b"60"], 5, "its arguments")
    assert proc.pid in procfs.children(os.getpid())
    assert proc.pid not in procfs.children(proc.pid)
    proc.kill()
    wait_until(lambda: procfs.start_time(proc.pid) is None, 5, "its exit")
    assert proc.pid in procfs.children(os.getpid())  # exited, not reaped: still ours
    assert procfs.program(proc.pid) is None
    proc.wait()
    assert proc.pid not in procfs.children(os.getpid())
    assert procfs.arguments(proc.pid) is None
