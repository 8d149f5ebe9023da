"""`souk dev` runs the private network on its one host: machines in namespaces of their own, and
`.internal` names answered by its first worker to all its machines, each network its own."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

from tests.network.one_host import ASK, SERVE
from tests.support.dev import souk_dev

pytestmark = [pytest.mark.integration, pytest.mark.skipif(os.geteuid() != 0, reason="needs root")]


def test_souk_devs_machines_find_their_apps_machines_by_name(tmp_path: Path) -> None:
    with souk_dev(tmp_path) as dev:
        dev.call("POST", "/v1/apps", {"name": "alpha"})
        dev.call("POST", "/v1/apps", {"name": "beta", "network": "other"})
        config = {"init": {"exec": [sys.executable, "-c", SERVE]}}
        made = {
            name: dev.call("POST", f"/v1/apps/{app}/machines", {"config": config, "region": region})
            for name, app, region in (
                ("a1", "alpha", "mad"),
                ("a2", "alpha", "ams"),
                ("b1", "beta", "mad"),
            )
        }
        for name, m in made.items():
            app = "beta" if name == "b1" else "alpha"
            dev.call("GET", f"/v1/apps/{app}/machines/{m['id']}/wait?state=started&timeout=30")

        def ask(name: str, app: str, machine: str) -> list[str]:
            body = {"command": [sys.executable, "-c", ASK, name], "timeout": 20}
            out = dev.call("POST", f"/v1/apps/{app}/machines/{machine}/exec", body)
            return str(out["stdout"] or out["stderr"]).split()

        def answers(name: str, app: str, machine: str, want: list[str]) -> None:
            deadline = time.monotonic() + 10
            while (found := ask(name, app, machine)) != want:
                assert time.monotonic() < deadline, (name, found)  # the replica catches up
                time.sleep(0.1)

        a1, b1 = made["a1"]["id"], made["b1"]["id"]
        answers(
            "alpha.internal",
            "alpha",
            a1,
            sorted([made["a1"]["private_ip"], made["a2"]["private_ip"]]),
        )
        answers("ams.alpha.internal", "alpha", a1, [made["a2"]["private_ip"]])
        answers("beta.internal", "beta", b1, [made["b1"]["private_ip"]])
        # every name known by now: another network's is not there for beta
        assert ask("alpha.internal", "beta", b1) == ["nxdomain"]
