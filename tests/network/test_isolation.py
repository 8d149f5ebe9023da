"""Isolation on a host (nftables, `souk.network.firewall`), shown on a host of its own: a real
worker in a network namespace made for the test (`one_host.py`, the `seen` fixture), with
forwarding on, a LAN address, a nats-server and an "internet" beside it."""

from __future__ import annotations

import os
import shutil
from typing import Any

import pytest

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root"),
    pytest.mark.skipif(not shutil.which("nats-server"), reason="needs nats-server"),
]


def test_a_machine_reaches_machines_of_its_network(seen: dict[str, Any]) -> None:
    assert seen["same_network"] == seen["ids"]["a2"]  # a2 answered a1, its own id


def test_networks_do_not_reach_each_other_either_way(seen: dict[str, Any]) -> None:
    assert seen["to_other_network"] == "dropped"
    assert seen["from_other_network"] == "dropped"


def test_a_machine_reaches_none_of_its_hosts_services(seen: dict[str, Any]) -> None:
    """The worker API and NATS, at every address of the host a machine could try."""
    assert seen["host"] and set(seen["host"].values()) == {"dropped"}, seen["host"]


def test_the_host_reaches_its_machines_and_they_the_internet_through_it(
    seen: dict[str, Any],
) -> None:
    assert seen["host_to_machine"] == "open"
    assert seen["internet"] == "open"
    assert seen["internet_saw"] == "198.51.100.1"  # masqueraded as the host


def test_a_machine_sends_from_no_address_but_its_own(seen: dict[str, Any]) -> None:
    """Datagrams from its own address and from one it gave itself: another machine's IPv4
    address, towards the internet through the host's masquerade, and a free one of its own
    network towards a machine of it. Only its own arrive."""
    assert seen["spoofed"] == {"ipv4_to_internet": "own", "ipv6_to_machine": "own"}
