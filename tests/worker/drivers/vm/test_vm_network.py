"""A vm guest on the private network, as every other machine: its own private address held by
the guest itself, its worker's resolver, `.internal` names, and the host's isolation rules
applied to it as to a runc machine. On a host of its own (`private_network.py`, under
`unshare -n`): a worker with the vm driver, its DNS and API, machines of two apps on two
networks."""

from __future__ import annotations

import ipaddress
import json
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

pytestmark = [pytest.mark.integration, pytest.mark.timeout(900)]
ROOT = Path(__file__).resolve().parents[4]


@pytest.fixture(scope="module")
def seen(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    if shutil.which("docker-registry") is None and shutil.which("registry") is None:
        pytest.skip("docker-registry is not installed")
    tmp = tmp_path_factory.mktemp("private_network")
    done = subprocess.run(
        [
            "unshare",
            "-n",
            sys.executable,
            "-m",
            "tests.worker.drivers.vm.private_network",
            str(tmp),
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=840,
        check=False,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    found: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return found


def test_the_guest_holds_its_machines_private_address_and_resolver(seen: dict[str, Any]) -> None:
    address = ipaddress.IPv6Address(seen["addresses"]["vm"])
    held = [line.split() for line in seen["guest_addresses"].splitlines()]
    assert [f for f in held if f[0] == address.exploded.replace(":", "") and f[-1] == "eth0"]
    assert seen["resolv_conf"] == f"nameserver {seen['resolver']}"
    assert seen["hostname"] == seen["ids"]["vm"]


def test_the_guest_reaches_a_machine_of_its_app_by_address_and_by_name(
    seen: dict[str, Any],
) -> None:
    at = seen["addresses"]
    assert seen["by_address"] == seen["ids"]["a2"]
    assert seen["by_name"] == seen["ids"]["a2"]
    assert seen["by_app_name"] == seen["ids"]["a2"]  # <app>.internal, the other machine of it
    assert at["a2"] in seen["names"] and at["vm"] in seen["names"]  # alpha.internal: both
    assert seen["back"] == "a guest"  # and the other machine reaches the guest


def test_networks_do_not_reach_each_other_either_way(seen: dict[str, Any]) -> None:
    assert seen["to_other_network"] == "dropped"
    assert seen["from_other_network"] == "dropped"


def test_the_guest_cannot_send_from_an_address_not_its_machines(seen: dict[str, Any]) -> None:
    assert seen["by_address"] == seen["ids"]["a2"]  # from its own, it is answered
    assert seen["spoofed"] == "dropped"  # from another of its network's, it is not


def test_the_guest_reaches_none_of_its_hosts_services(seen: dict[str, Any]) -> None:
    assert seen["api_from_host"] == ["open", "open"]
    assert set(seen["host"].values()) == {"dropped"}, seen["host"]


def test_the_guest_reaches_the_internet_masqueraded_as_its_host(seen: dict[str, Any]) -> None:
    assert seen["internet_saw"] == "198.51.100.1"
