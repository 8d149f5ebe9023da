"""Which ports of its machines a worker opens to the cluster's hosts (`souk.network.services`):
their services' and metrics ports, from the catalog's rows; and a host's table of the releases
before, whose hosts reached every port and whose machines' IPv4 sources went unchecked, brought
to these rules in place, its machines kept."""

from __future__ import annotations

import ipaddress
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from souk.models.catalog import MachineRow
from souk.models.machine import MachineMetrics
from souk.network.services import wanted
from souk.worker.machines.addresses import DEFAULT_PREFIX, worker_prefix

ROOT = Path(__file__).resolve().parents[2]
CLUSTER = ipaddress.IPv6Network(DEFAULT_PREFIX)
MINE = worker_prefix(DEFAULT_PREFIX, "acme/default", "w1")
THEIRS = worker_prefix(DEFAULT_PREFIX, "acme/default", "w2")


def row(mid: str, ip: str | None, worker: str = "w1", **kw: object) -> MachineRow:
    fields = {"state": "stopped", "ports": (8080,), **kw}
    return MachineRow.model_validate(
        {
            "id": mid,
            "app": "a",
            "region": "mad",
            "worker_id": worker,
            "instance_id": "i",
            "cpu_kind": "shared",
            "cpus": 1,
            "memory_mb": 256,
            "private_ip": ip,
            "updated_at": "t",
            **fields,
        }
    )


def test_a_workers_live_machines_at_their_service_and_metrics_ports() -> None:
    rows = [
        row("m1", str(MINE[1]), ports=(8080, 8443)),  # stopped: a proxy may wake it
        row("m2", str(MINE[2]), ports=(), metrics=MachineMetrics(port=9091)),
        row("m3", str(MINE[3]), state="destroyed"),
        row("m4", str(THEIRS[4]), worker="w2"),  # another worker's: its own to open
        row("m5", "127.0.0.5"),  # not on the private network
        row("m6", None),
    ]
    assert wanted("w1", CLUSTER, rows) == {
        (str(MINE[1]), 8080),
        (str(MINE[1]), 8443),
        (str(MINE[2]), 9091),
    }


def in_own_network(script: str) -> Any:
    """What `script` prints last, as JSON, run in a network namespace of its own: a table of
    its own to make, change and read."""
    done = subprocess.run(
        ["unshare", "-n", sys.executable, "-c", script],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    return json.loads(done.stdout.strip().splitlines()[-1])


# The table as the releases before made it: hosts reached every port of a machine, and a
# machine's IPv4 sources were not checked (its IPv6 ones only after its connections' answers).
BEFORE = """
table inet souk {
  set veths { type ifname; }
  set addrs { type ifname . ipv6_addr; }
  set nets { type ifname . ipv6_addr; flags interval; }
  chain forward {
    type filter hook forward priority filter; policy accept;
    iifname @veths jump from_machine
    oifname @veths jump to_machine
  }
  chain from_machine {
    ct state established,related accept
    meta nfproto ipv6 iifname . ip6 saddr != @addrs drop
    ip daddr 10.0.0.0/8 drop
  }
  chain to_machine {
    ct state established,related accept
    ip6 saddr fd73:6f75:6b00::/72 accept
    oifname . ip6 saddr @nets accept
    drop
  }
  chain input {
    type filter hook input priority filter; policy accept;
    iifname @veths jump machine_to_host
  }
  chain machine_to_host {
    ct state established,related accept
    drop
  }
}
add element inet souk veths { "sk0" }
add element inet souk addrs { "sk0" . fd73:6f75:6b00:1::7 }
"""

# A running machine's veth, with the host's route to its IPv4 address.
UPGRADE = f"""
import ipaddress, json, subprocess
from souk.network import firewall
from souk.network.nft import nft
for argv in ("link add sk0 type veth peer name sk0p", "link set sk0 up",
             "route add 10.200.0.9/32 dev sk0", "route add 10.201.0.0/16 dev sk0"):
    subprocess.run(["ip", *argv.split()], check=True)
nft().run({BEFORE!r})
firewall.ensure(ipaddress.IPv6Network({DEFAULT_PREFIX!r}), "fd73:6f75:6b00::3")
print(json.dumps(nft().run("list table inet souk")))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
@pytest.mark.skipif(not shutil.which("nft"), reason="needs nftables")
def test_a_table_of_the_release_before_is_upgraded_in_place() -> None:
    table = in_own_network(UPGRADE)
    assert "set ports" in table
    assert "ip6 saddr fd73:6f75:6b00::/72 ip6 daddr . th dport @ports accept" in table
    assert "ip6 saddr fd73:6f75:6b00::/72 accept" not in table  # every port: gone
    assert '"sk0" . fd73:6f75:6b00:1::7' in table  # its machines' elements kept
    assert 'elements = { "sk0" . 10.200.0.9 }' in table  # the running machine's IPv4 source
    chains = {
        chain.split("{", 1)[0].strip(): chain.split("{", 1)[1]
        for chain in table.split("chain ")[1:]
    }
    for chain in ("from_machine", "machine_to_host"):  # checked before the answers' rule
        assert chains[chain].index("ip saddr != @addrs4 drop") < chains[chain].index("ct state")
    assert chains["from_machine"].index("ip6 saddr != @addrs drop") < chains["from_machine"].index(
        "ct state"
    )


# A worker's ports kept through what can happen to the table under them: not made yet when the
# first row comes (a machine's row comes before its start), and made again from nothing; and the
# set not read at an update that changes nothing (every machine row of the cluster makes one).
KEPT = f"""
import ipaddress, json
from souk.network import firewall, services
from tests.network.test_service_ports import MINE, row
cluster = ipaddress.IPv6Network({DEFAULT_PREFIX!r})
ports = services.Ports("w1", str(cluster))
rows = [row("m1", str(MINE[1]))]
seen = {{}}
try:
    ports.update(rows)
    seen["no_table"] = "set"
except RuntimeError:
    seen["no_table"] = "said"
firewall.ensure(cluster, "fd73:6f75:6b00::3")
ports.update(rows)
seen["table_made"] = sorted(services.listed())
listed, reads = services.listed, []
services.listed = lambda: reads.append(1) or listed()
ports.update(rows)  # nothing to change: the set is not read
services.listed = listed
seen["reads_unchanged"] = len(reads)
firewall.reset()
firewall.ensure(cluster, "fd73:6f75:6b00::3")
ports.update(rows)
seen["table_made_again"] = sorted(services.listed())
print(json.dumps(seen))
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root")
@pytest.mark.skipif(not shutil.which("nft"), reason="needs nftables")
def test_a_machines_ports_reach_the_table_made_after_its_row_and_made_again() -> None:
    seen = in_own_network(KEPT)
    element = [str(MINE[1]), 8080]
    assert seen == {
        "no_table": "said",
        "table_made": [element],
        "reads_unchanged": 0,
        "table_made_again": [element],
    }
