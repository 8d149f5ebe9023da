"""Host commands run as their app's own user: what such a machine can and cannot reach."""

from __future__ import annotations

import json
import os
import secrets
import stat
import subprocess
import sys
from pathlib import Path

import pytest

from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.host.cgroups import detect
from souk.worker.machines import app_users
from souk.worker.settings import WorkerSettings
from tests.support.engines import destroy_all

from .conftest import machine, needs_root, pid_of

pytestmark = [pytest.mark.integration, needs_root]

# Run as the machine: tries each thing and reports the errno name it got, or "ok".
PROBE = r"""
import errno, json, os, sys

def attempt(action):
    try:
        action()
        return "ok"
    except OSError as exc:
        return errno.errorcode.get(exc.errno, str(exc.errno))

def read(path):
    return lambda: open(path, "rb").read(1)

def write(path):
    return lambda: open(path, "w").write("planted")

t = json.loads(sys.argv[1])
status = open("/proc/self/status").read().splitlines()
print(json.dumps({
    "ids": [line.split()[1:] for line in status if line.split(":")[0] in ("Uid", "Gid", "Groups")],
    "cwd": os.getcwd(),
    "home": os.environ["HOME"],
    "read_db": attempt(read(t["db"])),
    "read_own_log": attempt(read(t["log"])),
    "list_data_dir": attempt(lambda: os.listdir(t["data"])),
    "list_machines": attempt(lambda: os.listdir(t["machines"])),
    "list_apps": attempt(lambda: os.listdir(t["apps"])),
    "write_data_dir": attempt(write(t["data"] + "/planted")),
    "write_etc": attempt(write(t["etc"])),
    "list_other_app": attempt(lambda: os.listdir(t["other_app"])),
    "write_other_home": attempt(write(t["other_home"] + "/planted")),
    "signal_other_app": attempt(lambda: os.kill(t["other_pid"], 0)),
    "signal_own_app": attempt(lambda: os.kill(t["sibling_pid"], 0)),
    "write_own_home": attempt(write(os.environ["HOME"] + "/mine")),
}), flush=True)
"""


async def test_a_machine_reaches_its_own_directory_and_nothing_else(
    engine: Engine, worker_settings: WorkerSettings
) -> None:
    data = worker_settings.data_dir
    other = await engine.create(machine("beta", ["sleep", "600"]))
    sibling = await engine.create(machine("alpha", ["sleep", "600"]))
    other_pid, sibling_pid = await pid_of(engine, other.id), await pid_of(engine, sibling.id)
    targets = {
        "db": str(worker_settings.db_path),
        "data": str(data),
        "machines": str(data / "machines"),
        "apps": str(data / "apps"),
        "other_app": str(data / "apps" / "beta"),
        "other_home": str(app_users.home(data, "beta", other.id)),
        "other_pid": other_pid,
        "sibling_pid": sibling_pid,
    }
    probe_id = secrets.token_hex(7)
    targets["etc"] = f"/etc/souk-{probe_id}"
    targets["log"] = str(worker_settings.rundir(probe_id) / "stdout.log")
    argv = [sys.executable, "-c", PROBE, json.dumps(targets)]
    await engine.create(machine("alpha", argv).model_copy(update={"id": probe_id}))
    ok, done = await engine.wait(probe_id, "stopped", 30, None)
    assert ok, done.state
    out = (worker_settings.rundir(probe_id) / "stdout.log").read_text().splitlines()
    seen = json.loads(out[-1])

    uids = dict(engine.store.read.execute("SELECT app, uid FROM app_users").fetchall())
    assert uids["alpha"] != uids["beta"]
    assert {uids["alpha"], uids["beta"]} == {app_users.BASE, app_users.BASE + app_users.SPAN}
    uid = str(uids["alpha"])
    assert seen["ids"][0] == [uid] * 4 and seen["ids"][1] == [uid] * 4
    assert seen["ids"][2] == []  # no supplementary groups
    home = app_users.home(data, "alpha", probe_id)
    assert seen["cwd"] == seen["home"] == str(home)
    assert seen["write_own_home"] == "ok" and (home / "mine").stat().st_uid == int(uid)
    assert seen["signal_own_app"] == "ok"  # the same user: the check below is no accident
    assert seen["signal_other_app"] == "EPERM"
    for denied in (
        "read_db",
        "read_own_log",
        "list_data_dir",
        "list_machines",
        "list_apps",
        "write_data_dir",
        "write_etc",
        "list_other_app",
        "write_other_home",
    ):
        assert seen[denied] == "EACCES", (denied, seen[denied])
    assert not (data / "planted").exists() and not Path(str(targets["etc"])).exists()


async def test_the_data_directory_is_closed_but_the_way_to_each_app(
    engine: Engine, worker_settings: WorkerSettings
) -> None:
    m = await engine.create(machine("alpha", ["sleep", "600"]))
    pid = await pid_of(engine, m.id)
    data = worker_settings.data_dir
    uid = int(engine.store.read.execute("SELECT uid FROM app_users").fetchone()[0])

    def mode(path: Path) -> tuple[int, int, int]:
        st = os.lstat(path)
        return stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid

    assert mode(data) == (0o711, 0, 0)
    assert mode(data / "apps") == (0o711, 0, 0)
    assert mode(data / "apps" / "alpha") == (0o710, 0, uid)  # the app cannot rename in it
    assert mode(app_users.home(data, "alpha", m.id)) == (0o700, uid, uid)
    for entry in data.iterdir():
        if entry.name != "apps":
            assert mode(entry)[0] & 0o077 == 0, entry
    assert mode(worker_settings.rundir(m.id) / "stdout.log") == (0o600, 0, 0)
    status = Path(f"/proc/{pid}/status").read_text()
    assert f"Uid:\t{uid}\t{uid}\t{uid}\t{uid}" in status
    assert os.getpgid(pid) == pid  # still its own process group, which stop signals
    if detect() != "none":  # and in its cgroup, which the worker placed it in
        assert f"/souk/{worker_settings.name}/{m.id}" in Path(f"/proc/{pid}/cgroup").read_text()


async def test_a_restarted_worker_gives_each_app_the_same_ids(
    worker_settings: WorkerSettings,
) -> None:
    s = worker_settings
    async with running(Engine(s, make_driver("process", s))) as engine:
        first = await engine.create(machine("alpha", ["sleep", "600"]))
        first_pid = await pid_of(engine, first.id)
        await engine.create(machine("beta", ["sleep", "600"]))
    async with running(Engine(s, make_driver("process", s))) as engine:
        try:
            again = await engine.create(machine("alpha", ["sleep", "600"]))
            again_pid = await pid_of(engine, again.id)
            newcomer = await engine.create(machine("gamma", ["sleep", "600"]))
            newcomer_pid = await pid_of(engine, newcomer.id)
            rows = engine.store.read.execute(
                "SELECT app, slot, uid FROM app_users ORDER BY slot"
            ).fetchall()
            allocated = engine.store.read.execute(
                "SELECT resource FROM oplog WHERE kind = 'app' AND step = 'allocated'"
            ).fetchall()
            running_as = [_uid(first_pid), _uid(again_pid), _uid(newcomer_pid)]
        finally:
            await destroy_all(engine)
    assert [(r["app"], r["slot"]) for r in rows] == [("alpha", 0), ("beta", 1), ("gamma", 2)]
    assert [r["resource"] for r in allocated] == ["alpha", "beta", "gamma"]  # once each
    uids = {r["app"]: r["uid"] for r in rows}
    assert len(set(uids.values())) == 3
    # The first machine still runs (adopted by the new worker), as the same user as the new one.
    assert running_as == [uids["alpha"], uids["alpha"], uids["gamma"]]


def _uid(pid: int) -> int | None:
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    line = next(x for x in status.splitlines() if x.startswith("Uid:"))
    return int(line.split()[1])


NOT_ROOT = r"""
import asyncio, json, os, sys
from pathlib import Path
from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.settings import WorkerSettings

async def main():
    s = WorkerSettings(
        name="w1", region="mad", data_dir=Path(sys.argv[1]), cpus=1, memory_mb=256, durable=False
    )
    async with running(Engine(s, make_driver("process", s))) as engine:
        config = MachineConfig(init={"exec": ["sh", "-c", "id -u; pwd"]}, restart={"policy": "no"})
        m = await engine.create(CreateMachine(app="alpha", config=config))
        ok, _ = await engine.wait(m.id, "stopped", 15, None)
        users = engine.store.read.execute("SELECT app FROM app_users").fetchall()
        log = (s.rundir(m.id) / "stdout.log").read_text().split()
        print(json.dumps({"ok": ok, "log": log, "table": len(users), "id": m.id}))

asyncio.run(main())
"""


def test_a_worker_that_is_not_root_runs_machines_as_itself(tmp_path: Path) -> None:
    nobody = 65534
    data = tmp_path / "w1"
    data.mkdir()
    os.chown(data, nobody, nobody)
    src = Path(app_users.__file__).parents[3]
    proc = subprocess.run(
        [sys.executable, "-c", NOT_ROOT, str(data)],
        user=nobody,
        group=nobody,
        extra_groups=[],
        env={"PYTHONPATH": str(src), "PATH": os.environ["PATH"]},
        cwd=data,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    assert seen["ok"]
    assert seen["log"] == [str(nobody), str(app_users.home(data, "alpha", seen["id"]))]
    assert seen["table"] == 0  # no ids given out: there are none to give
