"""Suspend and resume, signal, exec, ps and versions on a real in-process worker running real
processes (the process driver)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any

from souk.worker.engine import Engine
from souk.worker.host.cgroups import ROOT
from tests.support.clients import Client
from tests.support.waiting import eventually

TICKER = "i=0; while :; do i=$((i+1)); echo $i > tick; sleep 0.01; done"


async def started(client: Client, config: dict[str, Any]) -> str:
    resp = await client.post("/v1/machines", json={"app": "demo", "config": config})
    assert resp.status == 201, await resp.text()
    mid: str = (await resp.json())["id"]
    resp = await client.get(f"/v1/machines/{mid}/wait", params={"state": "started"})
    assert (await resp.json())["ok"] is True
    return mid


async def wait_for(client: Client, mid: str, state: str) -> dict[str, Any]:
    resp = await client.get(f"/v1/machines/{mid}/wait", params={"state": state, "timeout": "10"})
    body: dict[str, Any] = await resp.json()
    assert resp.status == 200, body
    return body


def home(engine: Engine, mid: str) -> Path:
    return engine.settings.data_dir / "apps" / "demo" / mid


def ticks(engine: Engine, mid: str) -> int:
    text = (home(engine, mid) / "tick").read_text().strip()
    return int(text) if text else 0


def proc_state(pid: int) -> str:
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat[stat.rindex(")") + 2]


async def test_suspend_freezes_the_machine_and_start_resumes_the_same_process(
    client: Client, engine: Engine
) -> None:
    mid = await started(client, {"init": {"exec": ["sh", "-c", TICKER]}})
    await eventually(lambda: (home(engine, mid) / "tick").exists() and ticks(engine, mid) > 2)
    before = await (await client.get(f"/v1/machines/{mid}")).json()
    reserved = engine.capacity().reserved

    resp = await client.post(f"/v1/machines/{mid}/suspend")
    assert resp.status == 200, await resp.text()
    await wait_for(client, mid, "suspended")
    assert engine.capacity().reserved == reserved  # the room stays the machine's
    frozen_at = ticks(engine, mid)
    await asyncio.sleep(0.3)
    assert ticks(engine, mid) == frozen_at  # not one more tick while frozen
    pid = engine.supervisor.handle(mid)
    assert pid is not None
    if engine.drivers.command.cgroups.freezer == "v1":  # type: ignore[attr-defined]
        state = ROOT / "freezer" / "souk" / "w1" / mid / "freezer.state"
        assert state.read_text().strip() == "FROZEN"
    # Suspending again changes nothing; exec and signal wait for a resume.
    assert (await client.post(f"/v1/machines/{mid}/suspend")).status == 200
    resp = await client.post(f"/v1/machines/{mid}/exec", json={"command": ["true"]})
    assert resp.status == 409 and (await resp.json())["status"] == "invalid_state"
    # A non-forced destroy refuses a suspended machine as it refuses a started one.
    assert (await client.delete(f"/v1/machines/{mid}")).status == 409

    assert (await client.post(f"/v1/machines/{mid}/start")).status == 200
    after = await wait_for(client, mid, "started")
    assert after["instance_id"] == before["instance_id"]
    assert engine.supervisor.handle(mid) == pid  # the same process, resumed, not restarted
    await eventually(lambda: ticks(engine, mid) > frozen_at)
    body = await (await client.get(f"/v1/machines/{mid}")).json()
    events = [f"{e['type']}.{e.get('step')}" for e in body["events"]]
    assert "suspend.freeze" in events and "resume.thaw" in events
    assert sum(t.endswith(".spawn") for t in events) == 1


async def test_a_suspended_machine_stops_and_is_destroyed(client: Client, engine: Engine) -> None:
    mid = await started(client, {"init": {"exec": ["sleep", "60"]}})
    handle = engine.supervisor.handle(mid)
    assert handle is not None
    await client.post(f"/v1/machines/{mid}/suspend")
    await wait_for(client, mid, "suspended")
    assert (await client.post(f"/v1/machines/{mid}/stop", json={"timeout": "5s"})).status == 200
    await wait_for(client, mid, "stopped")
    assert not Path(f"/proc/{handle.pid}").exists() or proc_state(handle.pid) in "ZX"
    # and a suspended one is destroyed with force
    other = await started(client, {"init": {"exec": ["sleep", "60"]}})
    await client.post(f"/v1/machines/{other}/suspend")
    await wait_for(client, other, "suspended")
    resp = await client.delete(f"/v1/machines/{other}", params={"force": "true"})
    assert resp.status == 200
    await wait_for(client, other, "destroyed")


async def test_a_stop_of_a_suspended_machine_kills_it_frozen_never_resumed(
    client: Client, engine: Engine
) -> None:
    """As Fly discards a suspended machine's snapshot on a stop: its process never runs again,
    not even to handle the stop's signal, however long the stop's timeout."""
    script = 'trap "echo got > got; exit 0" INT TERM; : > ready; while :; do sleep 0.02; done'
    config = {"init": {"exec": ["sh", "-c", script]}, "stop_config": {"timeout": "120s"}}
    mid = await started(client, config)
    await eventually((home(engine, mid) / "ready").exists)
    await client.post(f"/v1/machines/{mid}/suspend")
    await wait_for(client, mid, "suspended")
    assert (await client.post(f"/v1/machines/{mid}/stop")).status == 200
    await wait_for(client, mid, "stopped")  # within its wait's 10 s: not the stop's 120
    assert not (home(engine, mid) / "got").exists()
    assert await engine.drivers.command.remaining(mid, None) == []


async def test_suspend_needs_a_started_machine(client: Client) -> None:
    body = {"app": "demo", "config": {"init": {"exec": ["sleep", "60"]}}, "start": False}
    mid = (await (await client.post("/v1/machines", json=body)).json())["id"]
    resp = await client.post(f"/v1/machines/{mid}/suspend")
    assert resp.status == 409 and (await resp.json())["status"] == "invalid_state"
    assert (await client.post("/v1/machines/nosuchmachine/suspend")).status == 404


async def test_signal_reaches_the_main_process(client: Client, engine: Engine) -> None:
    script = (
        'trap "echo hup >> got" HUP; trap "echo usr1 >> got" USR1; : > ready;'
        " while :; do sleep 0.02; done"
    )
    mid = await started(client, {"init": {"exec": ["sh", "-c", script]}})
    got = home(engine, mid) / "got"
    # Started means running as its app, not done setting up: a signal before its traps kills it.
    await eventually((home(engine, mid) / "ready").exists)
    resp = await client.post(f"/v1/machines/{mid}/signal", json={"signal": "SIGHUP"})
    assert resp.status == 200, await resp.text()
    await eventually(lambda: got.exists() and "hup" in got.read_text())
    resp = await client.post(f"/v1/machines/{mid}/signal", json={"signal": 10})  # SIGUSR1
    assert resp.status == 200, await resp.text()
    await eventually(lambda: "usr1" in got.read_text())
    events = await (await client.get(f"/v1/machines/{mid}/events")).json()
    assert [e["request"]["signal"] for e in events if e["type"] == "signal"] == [
        "SIGUSR1",
        "SIGHUP",
    ]
    for bad in ({"signal": "SIGNOPE"}, {"signal": 99}, {}, {"signal": True}):
        resp = await client.post(f"/v1/machines/{mid}/signal", json=bad)
        assert resp.status == 400 and (await resp.json())["status"] == "invalid", bad
    await client.post(f"/v1/machines/{mid}/stop", json={"signal": "SIGKILL"})
    await wait_for(client, mid, "stopped")
    resp = await client.post(f"/v1/machines/{mid}/signal", json={"signal": "SIGHUP"})
    assert resp.status == 409


async def test_exec_runs_as_the_machine_with_its_env_user_and_cgroup(
    client: Client, engine: Engine
) -> None:
    config = {"init": {"exec": ["sleep", "60"]}, "env": {"GREETING": "hola"}}
    mid = await started(client, config)
    main = engine.supervisor.handle(mid)
    assert main is not None
    script = "echo $GREETING; id -u; pwd; cat /proc/self/cgroup; echo oops >&2; exit 3"
    resp = await client.post(f"/v1/machines/{mid}/exec", json={"command": ["sh", "-c", script]})
    assert resp.status == 200, await resp.text()
    out = await resp.json()
    assert out["exit_code"] == 3 and out["stderr"] == "oops\n" and "exit_signal" not in out
    lines = out["stdout"].splitlines()
    assert lines[0] == "hola"
    assert int(lines[1]) == os.stat(f"/proc/{main.pid}").st_uid  # the machine's own user
    assert lines[2] == str(home(engine, mid))
    if engine.drivers.command.cgroups.mode != "none":  # type: ignore[attr-defined]
        assert any(line.endswith(f"/{mid}") for line in lines[3:])

    # stdin, Fly's older `cmd`, a missing program, and a command ended by a signal
    resp = await client.post(f"/v1/machines/{mid}/exec", json={"command": ["cat"], "stdin": "hi"})
    assert (await resp.json())["stdout"] == "hi"
    resp = await client.post(f"/v1/machines/{mid}/exec", json={"cmd": "echo a  b"})
    assert (await resp.json())["stdout"] == "a b\n"
    resp = await client.post(f"/v1/machines/{mid}/exec", json={"command": ["no-such-prog"]})
    assert (await resp.json())["exit_code"] == 127
    resp = await client.post(
        f"/v1/machines/{mid}/exec", json={"command": ["sh", "-c", "kill -TERM $$"]}
    )
    out = await resp.json()
    assert (out["exit_code"], out["exit_signal"]) == (143, 15)


async def test_exec_past_its_timeout_is_killed_and_answered_408(
    client: Client, engine: Engine
) -> None:
    mid = await started(client, {"init": {"exec": ["sleep", "60"]}})
    body: dict[str, Any] = {
        "command": ["sh", "-c", "echo started > exec-ran; exec sleep 77"],
        "timeout": 1,
    }
    resp = await client.post(f"/v1/machines/{mid}/exec", json=body)
    assert resp.status == 408 and (await resp.json())["status"] == "timeout"
    assert (home(engine, mid) / "exec-ran").exists()
    listed = await (await client.get(f"/v1/machines/{mid}/ps")).json()
    assert not any("sleep 77" in p["command"] for p in listed)  # killed, not left behind
    bad: dict[str, Any]
    for bad in (
        {},
        {"command": []},
        {"command": ["x"], "timeout": 0},
        {"cmd": "x", "container": "y"},
    ):
        resp = await client.post(f"/v1/machines/{mid}/exec", json=bad)
        assert resp.status == 400, bad


PORT_SCRIPT = (
    "import socket, time\n"
    "s = socket.socket(); s.bind(('127.0.0.1', 0)); s.listen()\n"
    "open('port', 'w').write(str(s.getsockname()[1]))\n"
    "time.sleep(60)\n"
)


async def test_ps_lists_the_machines_processes_in_flys_shape(
    client: Client, engine: Engine
) -> None:
    mid = await started(client, {"init": {"exec": ["python3", "-c", PORT_SCRIPT]}})
    port_file = home(engine, mid) / "port"
    await eventually(lambda: port_file.exists() and port_file.read_text() != "")
    port = int(port_file.read_text())
    main = engine.supervisor.handle(mid)
    assert main is not None
    resp = await client.get(f"/v1/machines/{mid}/ps")
    assert resp.status == 200
    listed = await resp.json()
    assert [p["pid"] for p in listed] == [main.pid]
    (proc,) = listed
    assert set(proc) == {
        "pid",
        "command",
        "directory",
        "cpu",
        "rss",
        "rtime",
        "stime",
        "listen_sockets",
    }
    assert "python3 -c import socket" in proc["command"] and proc["rss"] > 0
    assert proc["directory"] == str(home(engine, mid))
    assert {"proto": "tcp", "address": f"127.0.0.1:{port}"} in proc["listen_sockets"]
    # an exec'd command shows up beside it, in the order asked
    body = {"command": ["sleep", "5"], "timeout": 1}
    running = asyncio.ensure_future(client.post(f"/v1/machines/{mid}/exec", json=body))
    driver = engine.drivers.command

    async def both() -> bool:
        return len(await driver.remaining(mid, main)) == 2

    await eventually(both)
    by_pid = await (await client.get(f"/v1/machines/{mid}/ps", params={"order": "desc"})).json()
    assert len(by_pid) == 2 and by_pid[0]["pid"] > by_pid[1]["pid"]
    resp = await client.get(f"/v1/machines/{mid}/ps", params={"sort_by": "colour"})
    assert resp.status == 400
    assert (await running).status == 408


async def test_versions_lists_every_config_newest_first(client: Client) -> None:
    body = {"app": "demo", "config": {"init": {"exec": ["sleep", "60"]}}, "start": False}
    first = await (await client.post("/v1/machines", json=body)).json()
    mid = first["id"]
    update = {"config": {"init": {"exec": ["sleep", "61"]}, "env": {"V": "2"}}}
    second = await (await client.put(f"/v1/machines/{mid}", json=update)).json()
    versions = await (await client.get(f"/v1/machines/{mid}/versions")).json()
    assert [v["version"] for v in versions] == [second["instance_id"], first["instance_id"]]
    assert versions[0]["user_config"]["env"] == {"V": "2"}
    assert versions[1]["user_config"]["init"]["exec"] == ["sleep", "60"]
    # metadata changes in place: no new version
    await client.patch(f"/v1/machines/{mid}/metadata", json={"set": {"k": "v"}})
    assert len(await (await client.get(f"/v1/machines/{mid}/versions")).json()) == 2
    assert (await client.get("/v1/machines/nosuchmachine/versions")).status == 404


async def test_a_leased_suspended_machine_is_not_resumed_without_the_nonce(
    client: Client, engine: Engine
) -> None:
    mid = await started(client, {"init": {"exec": ["sh", "-c", TICKER]}})
    await eventually(lambda: (home(engine, mid) / "tick").exists() and ticks(engine, mid) > 2)
    await client.post(f"/v1/machines/{mid}/suspend")
    await wait_for(client, mid, "suspended")
    lease = await (
        await client.post(f"/v1/machines/{mid}/lease", json={"ttl": 60, "owner": "o"})
    ).json()
    frozen_at = ticks(engine, mid)
    resp = await client.post(f"/v1/machines/{mid}/start")
    assert resp.status == 409 and (await resp.json())["status"] == "lease_held"
    await asyncio.sleep(0.2)
    assert ticks(engine, mid) == frozen_at  # the refused start thawed nothing
    headers = {"fly-machine-lease-nonce": lease["nonce"]}
    assert (await client.post(f"/v1/machines/{mid}/start", headers=headers)).status == 200
    await wait_for(client, mid, "started")
    await eventually(lambda: ticks(engine, mid) > frozen_at)
    # the lease guards a signal as it guards a stop
    hup = {"signal": "SIGUSR1"}
    resp = await client.post(f"/v1/machines/{mid}/signal", json=hup)
    assert resp.status == 409 and (await resp.json())["status"] == "lease_held"
    resp = await client.post(f"/v1/machines/{mid}/signal", json=hup, headers=headers)
    assert resp.status == 200


async def test_update_and_restart_of_a_suspended_machine_start_it_afresh(
    client: Client, engine: Engine
) -> None:
    mid = await started(client, {"init": {"exec": ["sleep", "60"]}})
    first = engine.supervisor.handle(mid)
    await client.post(f"/v1/machines/{mid}/suspend")
    await wait_for(client, mid, "suspended")
    assert (await client.post(f"/v1/machines/{mid}/restart")).status == 200
    await wait_for(client, mid, "started")
    second = engine.supervisor.handle(mid)
    assert second is not None and second != first  # a new process: a restart is not a resume

    await client.post(f"/v1/machines/{mid}/suspend")
    await wait_for(client, mid, "suspended")
    update = {"config": {"init": {"exec": ["sleep", "61"]}}}
    updated = await (await client.put(f"/v1/machines/{mid}", json=update)).json()
    resp = await client.get(
        f"/v1/machines/{mid}/wait",
        params={"state": "started", "instance_id": updated["instance_id"], "timeout": "10"},
    )
    assert resp.status == 200
    third = engine.supervisor.handle(mid)
    assert third is not None and third not in (first, second)
    procs = await (await client.get(f"/v1/machines/{mid}/ps")).json()
    assert [p["command"] for p in procs] == ["sleep 61"]
