"""Two hosts joined by the WireGuard mesh (wireguard-go where the kernel has no WireGuard), each
a network namespace with a real `souk worker` on it (`two_hosts.py`), a nats-server between
them: a machine reaches one of its app on the other host by address and by name, and nothing
of another network or of the other host itself."""

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
    return bed_findings(tmp_path_factory, "two_hosts", 180)


def test_a_machine_reaches_one_of_its_app_on_another_host(seen: dict[str, Any]) -> None:
    assert seen["by_address"] == seen["ids"]["b1"]
    assert seen["back"] == seen["ids"]["a1"]  # and the other way


def test_and_by_name(seen: dict[str, Any]) -> None:
    assert seen["by_name"] == seen["ids"]["b1"]
    at = seen["addresses"]
    assert seen["names"] == sorted([at["a1"], at["b1"]])  # both hosts' machines of the app


def test_not_another_networks_machine_nor_the_other_host(seen: dict[str, Any]) -> None:
    assert seen["to_other_network"] == "dropped"
    assert seen["from_other_network"] == "dropped"
    assert seen["other_host"] == "dropped"  # the other worker's API, on its own address


def test_another_host_reaches_a_machines_service_ports_only(seen: dict[str, Any]) -> None:
    assert seen["host_to_service"] == "open"
    assert seen["host_to_other_port"] == "dropped"
    assert seen["machine_to_other_port"] == seen["ids"]["b1"]  # its network reaches every port


def test_a_hosts_link_cut_and_restored_the_mesh_carries_on(seen: dict[str, Any]) -> None:
    assert seen["link_down"] == "dropped"
    assert seen["names_link_down"] == [seen["addresses"]["b1"]]  # its machine still runs
    assert seen["link_up"] == seen["ids"]["b1"]  # by name again, with no change made


def test_a_hosts_key_rotated_its_peers_follow_and_traffic_flows(seen: dict[str, Any]) -> None:
    turn = seen["rotation"]
    assert turn["old"] in turn["peers_before"] and turn["new"] != turn["old"]
    assert turn["a_key"] == turn["new"]  # A's interface runs on the key the command wrote
    assert turn["new"] in turn["peers_after"]
    assert turn["old"] not in turn["peers_after"]  # the old key opens nothing on B any more
    assert turn["reached"] == seen["ids"]["b1"]
    assert turn["back"] == seen["ids"]["a1"]
