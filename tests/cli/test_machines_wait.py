"""`souk machines stop|start|destroy` return once the machine is in the state asked for, as
flyctl does (`--detach` returns at once), and say what to do in the CLI's own words."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.cli.conftest import souk
from tests.support.dev import Dev

pytestmark = pytest.mark.integration

STUBBORN = ["sh", "-c", 'trap "" TERM INT; exec sleep 600']  # stops at its stop timeout only


def machine(project: Path, verb: str, *args: str) -> dict[str, Any]:
    done = souk("machines", verb, "-a", "waits", "--json", *args, cwd=project)
    assert done.returncode == 0, done.stderr
    found: dict[str, Any] = json.loads(done.stdout)
    return found


def test_stop_start_and_destroy_wait_for_their_state(dev: Dev, project: Path) -> None:
    assert souk("apps", "create", "waits", cwd=project).returncode == 0
    created = machine(project, "run", "-r", "mad", "--", *STUBBORN)
    mid = created["id"]
    assert machine(project, "start", mid)["state"] == "started"  # already: returns at once
    assert machine(project, "stop", mid)["state"] == "stopped"  # after its 5 s stop timeout
    assert machine(project, "start", mid)["state"] == "started"
    refused = souk("machines", "destroy", mid, "-a", "waits", cwd=project)
    assert refused.returncode == 1
    assert "--force" in refused.stderr and "force=true" not in refused.stderr, refused.stderr

    detached = machine(project, "stop", "--detach", mid)
    assert detached["state"] in ("started", "stopping")

    assert machine(project, "destroy", "--force", mid)["state"] == "destroyed"
