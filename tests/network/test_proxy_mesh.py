"""A proxy on a host of its own reaches a machine two hosts away over the mesh, and scales it
from zero (`three_hosts.py`: a broker and a worker on host A, a worker on B, `souk proxy
--mesh-port` alone on C)."""

from __future__ import annotations

import os
import shutil
from pathlib import Path
from typing import Any

import pytest

from tests.network.conftest import bed_findings

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
    pytest.mark.skipif(not shutil.which("nats-server"), reason="needs nats-server"),
    pytest.mark.skipif(not shutil.which("wg"), reason="needs wireguard-tools"),
]
ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    return bed_findings(tmp_path_factory, "three_hosts", 180)


def test_a_proxy_wakes_a_machine_two_hosts_away_and_is_answered_by_it(
    seen: dict[str, Any],
) -> None:
    assert seen["worker"] == "wb"  # the machine is on host B; the proxy on C
    assert seen["status"] == 200
    assert seen["answered_by"] == seen["machine"]
    assert seen["body"]["machine"] == seen["machine"] and seen["body"]["region"] == "ams"
    assert seen["state"] == "started"  # started from zero by the request


def test_the_proxy_hosts_key_rotated_the_workers_follow(seen: dict[str, Any]) -> None:
    turn = seen["rotation"]
    assert turn["old"] in turn["peers_before"]
    assert turn["new"] in turn["peers_after"] and turn["old"] not in turn["peers_after"]
    assert turn["status"] == 200 and turn["answered_by"] == seen["machine"]
