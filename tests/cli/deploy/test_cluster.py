"""`souk deploy` and friends against a real local cluster, with the example app as real
processes: first deploy with standbys, rolling updates, a broken release stopping at its first
machine, blue/green and its rollback, `souk rollback`, scale, status, logs, and two deploys at
once."""

from __future__ import annotations

import asyncio
import http.client
import json
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from souk.cli.deploy.config import loads
from souk.cli.deploy.errors import DeployInProgress
from souk.cli.deploy.output import Outcome
from souk.cli.deploy.progress import Progress
from souk.cli.deploy.run import deploy
from souk.clients.machines import MachinesClient
from tests.support.dev import Dev
from tests.support.hello import HELLO

pytestmark = pytest.mark.integration

BROKEN = ["sh", "-c", "echo starting broken; echo oops >&2; exit 3"]


def toml(
    app: str,
    greeting: str,
    command: list[str] | None = None,
    regions: str = "mad = 1, ams = 1",
    strategy: str = "rolling",
) -> str:
    argv = command or [sys.executable, str(HELLO)]
    return f"""
app = "{app}"
command = {json.dumps(argv)}
regions = {{ {regions} }}

[guest]
cpus = 1
memory_mb = 128

[env]
GREETING = "{greeting}"

[[services]]
internal_port = 8080
autostop = "stop"
min_machines_running = 1

[checks.alive]
type = "tcp"
port = 8080
interval = "1s"
timeout = "1s"

[restart]
policy = "on-failure"
max_retries = 3

[deploy]
strategy = "{strategy}"
wait_timeout = "30s"
"""


class App:
    def __init__(self, dev: Dev, name: str, tmp: Path) -> None:
        self.dev, self.name, self.tmp = dev, name, tmp
        self.n = 0

    def deploy(self, greeting: str, *args: str, **kw: Any) -> tuple[int, Any, str]:
        """`souk deploy --json`: (exit code, the JSON answer, stderr)."""
        self.n += 1
        path = self.tmp / f"souk-{self.n}.toml"
        path.write_text(toml(self.name, greeting, **kw))
        result = self.dev.souk("deploy", "-c", str(path), "--json", *args)
        return result.exit_code, json.loads(result.stdout), result.stderr

    def souk(self, *args: str) -> Any:
        result = self.dev.souk(*args, "--app", self.name, "--json")
        assert result.exit_code == 0, result.output
        return json.loads(result.stdout)

    def machines(self) -> list[dict[str, Any]]:
        return [m for m in self.dev.machines(self.name) if m["state"] != "destroyed"]

    def role(self, role: str) -> list[dict[str, Any]]:
        return [m for m in self.machines() if m["config"]["metadata"].get("souk.role") == role]

    def greetings(self, skip: str | None = None) -> dict[str, str]:
        """What each started primary answers over HTTP, by machine id (but `skip`'s: a machine
        whose command keeps exiting is `started` for a moment at each restart)."""
        out = {}
        for m in self.role("primary"):
            if m["state"] == "started" and m["id"] != skip:
                with urllib.request.urlopen(f"http://{m['private_ip']}:8080/", timeout=5) as r:
                    out[m["id"]] = json.loads(r.read())["hello"]
        return out


@pytest.fixture
def app(dev: Dev, tmp_path: Path, request: pytest.FixtureRequest) -> Iterator[App]:
    name = request.node.name.removeprefix("test_").replace("_", "-")[:40]
    yield App(dev, name, tmp_path)
    dev.destroy_app(name)


def releases_of(m: dict[str, Any]) -> str:
    return str(m["config"]["metadata"]["souk.release"])


def test_first_deploy_standbys_then_rolling_update_and_rollback(app: App) -> None:
    code, out, err = app.deploy("v1")
    assert code == 0, err
    assert out["ok"] and out["release"] == 1
    primaries, standbys = app.role("primary"), app.role("standby")
    assert sorted(m["region"] for m in primaries) == ["ams", "mad"]
    assert all(m["state"] == "started" for m in primaries)
    by_id = {m["id"]: m for m in primaries}
    assert len(standbys) == 2
    for s in standbys:
        primary = by_id[s["config"]["standbys"][0]]
        assert s["state"] in ("created", "stopped")
        assert s["region"] == primary["region"] and s["worker"] != primary["worker"]
    assert set(app.greetings().values()) == {"v1"}

    code, out, err = app.deploy("v2")
    assert code == 0, err
    assert out["release"] == 2
    steps = [e["step"] for e in out["events"] if "step" in e]
    assert any(s.startswith("updated primary") for s in steps)
    machines = app.machines()
    assert len(machines) == 4 and {releases_of(m) for m in machines} == {"2"}
    assert {m["id"] for m in app.role("primary")} == set(by_id)  # updated in place
    assert set(app.greetings().values()) == {"v2"}
    marks = {m["config"]["metadata"]["souk_secrets"] for m in app.machines()}
    assert len(marks) == 1  # standbys hold the same secrets as their primaries
    for s in app.role("standby"):
        assert "env" not in s["config"] and s["state"] in ("created", "stopped")

    # The env's values are the app's secrets: nowhere in the release records, nor in the
    # machines' configs; a secrets list shows names and digests.
    everything = app.dev.call("GET", f"/v1/apps/{app.name}/metadata")
    assert '"v1"' not in json.dumps(everything) and '"v2"' not in json.dumps(everything)
    assert not [k for k in everything if k.startswith("sealed.")]
    assert json.loads(everything["release.1"])["env"] == ["GREETING"]
    (secret,) = app.souk("secrets", "list")
    assert secret["name"] == "GREETING" and "value" not in secret

    # A rollback brings release 1's config back; the env stays the app's secrets as they are
    # now (as on Fly), so v2 answers on.
    back = app.souk("rollback")
    assert back["release"] == 3
    assert set(app.greetings().values()) == {"v2"}
    assert json.loads(app.dev.call("GET", f"/v1/apps/{app.name}/metadata")["release.3"])["env"] == [
        "GREETING"
    ]
    listed = app.souk("releases")
    assert [(r["version"], r["status"], r["current"]) for r in listed] == [
        (3, "complete", True),
        (2, "complete", False),
        (1, "complete", False),
    ]
    assert listed[0]["description"] == "rollback to 1"


def test_a_broken_release_stops_at_its_first_machine(app: App) -> None:
    assert app.deploy("v1")[0] == 0
    before = {m["id"]: m for m in app.machines()}
    code, out, _ = app.deploy("v2", command=BROKEN)
    assert code == 1 and out["ok"] is False
    assert out["exit_code"] == 3
    assert "exited with code 3" in out["error"]
    assert "oops" in out["logs"]["stderr"]
    assert "starting broken" in out["logs"]["stdout"]
    failed = out["machine"]
    # only the first machine was touched: every other one is still on release 1
    touched = [m for m in app.machines() if releases_of(m) != "1"]
    assert [m["id"] for m in touched] == [failed]
    assert set(before) == {m["id"] for m in app.machines()}
    healthy = app.greetings(skip=failed)
    assert set(healthy.values()) == {"v1"} and len(healthy) >= 1
    status = app.souk("status")
    assert status["release"] == 1
    listed = app.souk("releases")
    assert listed[0]["version"] == 2 and listed[0]["status"] == "failed"
    assert "exited with code 3" in listed[0]["error"]

    # the text output says the same, with the machine's last lines
    path = app.tmp / "broken.toml"
    path.write_text(toml(app.name, "v3", command=BROKEN))
    result = app.dev.souk("deploy", "-c", str(path))
    assert result.exit_code == 1
    assert "exited with code 3" in result.stderr and "oops" in result.stderr

    # a rollback by default repairs the half-done deploy: back to the current release's
    # command, every machine alike on the env as the app's secrets hold it now (the last
    # deploy set it: secrets are not rolled back, as on Fly)
    back = app.souk("rollback")
    assert back["release"] == 4
    assert {releases_of(m) for m in app.machines()} == {"4"}
    assert set(app.greetings().values()) == {"v3"} and len(app.greetings()) == 2


def test_bluegreen_reveals_a_new_set_or_rolls_back(app: App) -> None:
    assert app.deploy("v1")[0] == 0
    blue = {m["id"] for m in app.machines()}

    code, out, _ = app.deploy("v2", command=BROKEN, strategy="bluegreen")
    assert code == 1 and out["exit_code"] == 3
    assert any("rollback" in e.get("step", "") for e in out["events"])
    assert {m["id"] for m in app.machines()} == blue  # the green machines are gone
    assert set(app.greetings().values()) == {"v1"} and len(app.greetings()) == 2

    code, out, err = app.deploy("v3", strategy="bluegreen")
    assert code == 0, err
    green = app.machines()
    assert len(green) == 4 and not {m["id"] for m in green} & blue
    assert not any(m["config"]["metadata"].get("souk.hidden") for m in green)
    assert set(app.greetings().values()) == {"v3"}


def test_canary_immediate_scale_status_and_logs(app: App) -> None:
    assert app.deploy("v1", regions="mad = 1")[0] == 0
    code, out, err = app.deploy("v2", regions="mad = 1", strategy="canary")
    assert code == 0, err
    assert any(e.get("step", "").startswith("created canary") for e in out["events"])
    assert not app.role("canary")
    assert set(app.greetings().values()) == {"v2"}
    code, out, err = app.deploy("v3", "--strategy", "immediate", regions="mad = 1")
    assert code == 0, err and out["strategy"] == "immediate"

    scaled = app.souk("scale", "count", "2", "--region", "mad")
    assert scaled["release"] == 3
    primaries = app.role("primary")
    assert len(primaries) == 2 and len(app.role("standby")) == 2
    status = app.souk("status")
    assert status["release"] == 3
    assert status["regions"]["mad"]["started"] == 2
    assert all(r["health"] == "1/1 passing" for r in status["machines"] if r["role"] == "primary")

    result = app.dev.souk("logs", "--app", app.name)
    assert result.exit_code == 0
    lines = result.stdout.splitlines()
    for m in primaries:
        assert any(line.startswith(f"mad {m['id']} | hello listening") for line in lines)

    app.souk("scale", "count", "0", "--region", "mad")
    assert app.machines() == []


def test_two_deploys_at_once_one_is_refused(app: App) -> None:
    assert app.deploy("v1")[0] == 0

    async def both() -> tuple[Outcome | BaseException, Outcome | BaseException]:
        async def one(greeting: str) -> Outcome:
            cfg = loads(toml(app.name, greeting))
            async with MachinesClient(app.dev.url, app.dev.token) as api:
                return await deploy(api, cfg, Progress(quiet=True))

        return await asyncio.gather(one("v2"), one("v3"), return_exceptions=True)

    results = asyncio.run(both())
    refused = [r for r in results if isinstance(r, DeployInProgress)]
    done = [r for r in results if isinstance(r, Outcome)]
    assert len(refused) == 1 and len(done) == 1, results
    assert "deploy in progress" in str(refused[0])
    winner = "v2" if results[0] is done[0] else "v3"
    assert set(app.greetings().values()) == {winner}
    assert {releases_of(m) for m in app.machines()} == {str(done[0].release)}
    # nothing is left held: the next deploy goes through
    assert app.deploy("v4")[0] == 0


def test_a_rolling_deploy_under_load_through_the_proxy_fails_no_request(app: App) -> None:
    code, _, err = app.deploy("v1")
    assert code == 0, err
    seen: list[str] = []
    failures: list[str] = []
    stop = threading.Event()

    def hammer() -> None:
        while not stop.is_set():
            req = urllib.request.Request(app.dev.proxy + "/", headers={"souk-app": app.name})
            try:
                with urllib.request.urlopen(req, timeout=10) as resp:
                    seen.append(json.loads(resp.read())["hello"])
            except (OSError, ValueError, http.client.HTTPException) as exc:  # a truncated
                failures.append(repr(exc))  # answer (IncompleteRead) fails the test too

    clients = [threading.Thread(target=hammer) for _ in range(4)]
    for t in clients:
        t.start()
    try:
        while "v1" not in seen and not failures:
            time.sleep(0.01)
        code, _, err = app.deploy("v2")
        assert code == 0, err
        deadline = time.monotonic() + 10
        while seen[-1] != "v2" and time.monotonic() < deadline:
            time.sleep(0.01)
    finally:
        stop.set()
        for t in clients:
            t.join()
    assert failures == []
    assert seen[0] == "v1" and seen[-1] == "v2" and len(seen) > 20
