"""A machine's network namespace, made by the worker's own system calls and netlink messages."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

import souk.worker.oci.network as network

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="needs root")


@pytest.fixture
def machine_id() -> Iterator[str]:
    mid = f"nt{uuid.uuid4().hex[:10]}"
    yield mid
    netns, veth = network.names(mid)
    subprocess.run(["ip", "link", "del", veth], capture_output=True, check=False)
    subprocess.run(["ip", "netns", "del", netns], capture_output=True, check=False)


def ip(*args: str) -> str:
    return subprocess.run(["ip", *args], capture_output=True, text=True, check=True).stdout


def gone(machine_id: str) -> bool:
    netns, veth = network.names(machine_id)
    return not (network.NETNS_DIR / netns).exists() and not network._conf(veth).exists()


async def test_a_namespace_holds_the_address_and_the_host_routes_to_it(machine_id: str) -> None:
    own = os.readlink("/proc/thread-self/ns/net")
    path = await network.setup(machine_id, "10.213.0.7")
    netns, veth = network.names(machine_id)
    assert path == network.NETNS_DIR / netns
    assert os.readlink("/proc/thread-self/ns/net") == own  # the worker's threads stay home
    assert "inet 10.213.0.7/32 " in ip("-n", netns, "addr", "show", "dev", "eth0")
    routes = ip("-n", netns, "route")
    assert f"default via {network.GATEWAY} dev eth0" in routes
    assert f"{network.GATEWAY} dev eth0 scope link" in routes
    assert "UP" in ip("-n", netns, "link", "show", "dev", "lo")
    assert f"dev {veth}" in ip("route", "get", "10.213.0.7")
    assert f"inet {network.GATEWAY}/32 " in ip("addr", "show", "dev", veth)
    assert (network._conf(veth) / "proxy_arp").read_text().strip() == "1"
    await network.teardown(machine_id)
    assert gone(machine_id)
    await network.teardown(machine_id)  # and again: nothing to do


async def test_setup_again_keeps_a_complete_namespace(machine_id: str) -> None:
    path = await network.setup(machine_id, "10.213.0.8")
    first = path.stat().st_ino
    assert await network.setup(machine_id, "10.213.0.8") == path
    assert path.stat().st_ino == first  # found complete: not made again
    await network.setup(machine_id, "10.213.0.9")  # another address: made anew
    assert path.stat().st_ino != first
    assert "inet 10.213.0.9/32 " in ip("-n", path.name, "addr", "show", "dev", "eth0")
    await network.teardown(machine_id)
    assert gone(machine_id)


async def test_a_setup_that_stopped_midway_is_made_again_or_torn_down(
    machine_id: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A worker killed between the namespace's name and the machine's address (the last thing
    made) leaves a namespace that setup does not take for complete, and teardown removes."""

    def killed(self: network._Netlink, index: int, address: str) -> None:
        if address != network.GATEWAY:
            raise network.NetworkError("killed")
        real(self, index, address)

    real = network._Netlink.add_address
    monkeypatch.setattr(network._Netlink, "add_address", killed)
    with pytest.raises(network.NetworkError):
        await network.setup(machine_id, "10.213.0.10")
    netns, veth = network.names(machine_id)
    assert (network.NETNS_DIR / netns).exists() and network._conf(veth).exists()
    monkeypatch.setattr(network._Netlink, "add_address", real)
    path = await network.setup(machine_id, "10.213.0.10")
    assert "inet 10.213.0.10/32 " in ip("-n", netns, "addr", "show", "dev", "eth0")
    await network.teardown(machine_id)
    assert gone(machine_id) and not path.exists()


async def test_a_name_left_without_a_namespace_is_replaced(machine_id: str) -> None:
    """An empty file where the name goes (a crash before the bind mount)."""
    netns, _ = network.names(machine_id)
    network.NETNS_DIR.mkdir(parents=True, exist_ok=True)
    Path(network.NETNS_DIR / netns).touch()
    await network.setup(machine_id, "10.213.0.11")
    assert "inet 10.213.0.11/32 " in ip("-n", netns, "addr", "show", "dev", "eth0")
    await network.teardown(machine_id)
    assert gone(machine_id)


KILLED_MIDWAY = """
import asyncio, sys, time
import souk.worker.oci.network as network
real = network._Netlink.add_address
def slow(self, index, address):
    if address != network.GATEWAY:
        print("ready", flush=True)
        time.sleep(60)
    real(self, index, address)
network._Netlink.add_address = slow
asyncio.run(network.setup(sys.argv[1], "10.213.0.12"))
"""


def kill_midway(machine_id: str) -> None:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    proc = subprocess.Popen(
        [sys.executable, "-c", KILLED_MIDWAY, machine_id], stdout=subprocess.PIPE, env=env
    )
    try:
        assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"
    finally:
        proc.kill()
        proc.wait()


async def test_a_worker_killed_midway_leaves_what_teardown_removes(machine_id: str) -> None:
    """kill -9 while the namespace is being made (all but the machine's address there): the
    next worker's teardown (or setup) finds all of it by the machine's name."""
    kill_midway(machine_id)
    netns, veth = network.names(machine_id)
    assert (network.NETNS_DIR / netns).exists() and network._conf(veth).exists()
    await network.teardown(machine_id)
    assert gone(machine_id)
