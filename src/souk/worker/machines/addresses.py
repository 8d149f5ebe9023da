"""Private addresses: one of its own per machine, so that two machines of one app can bind one
port on one host, and so that an address says where it routes (docs/network.md).

An address on the private network is the cluster's /48 (a ULA prefix), then 24 bits naming the
app's private network (a /72 each), 24 bits naming the worker (a /96 each, what the mesh routes
to that worker's host), and 32 bits for the machine, drawn at random among those no row of this
worker names (a destroyed machine's row still names its address until the row is gone)."""

from __future__ import annotations

import hashlib
import ipaddress
import os

from souk.models.wire import DEFAULT_NETWORK, DEFAULT_PRIVATE_PREFIX
from souk.worker.drivers.base import DriverKind
from souk.worker.state import queries
from souk.worker.state.queries import Db

DEFAULT_PREFIX = DEFAULT_PRIVATE_PREFIX


def isolated() -> bool:
    """Whether this worker gives each machine a network namespace of its own (it must be root
    to make one); a host command of any other worker gets a loopback address, as before."""
    return os.geteuid() == 0


def _bits(name: str) -> int:
    return int.from_bytes(hashlib.sha256(name.encode()).digest()[:3], "big")


def network_prefix(cluster: str, network: str) -> ipaddress.IPv6Network:
    """The /72 of `network` (`<org>/<name>`: an org's default, or one named at `POST
    /v1/apps`): 24 bits of its hash, so that every worker draws the same without asking."""
    base = ipaddress.IPv6Network(cluster)
    if base.prefixlen != 48:
        raise ValueError(f"the cluster's private prefix must be a /48, not {cluster}")
    bits = _bits(network) or 1  # 0: the hosts' own (`souk.network.firewall.infra`)
    return ipaddress.IPv6Network((int(base.network_address) | bits << 56, 72))


def worker_prefix(cluster: str, network: str, worker: str) -> ipaddress.IPv6Network:
    """The /96 of `worker` within `network`: its machines' addresses there."""
    net = network_prefix(cluster, network)
    return ipaddress.IPv6Network((int(net.network_address) | _bits(worker) << 32, 96))


def worker_bits(worker: str) -> int:
    return _bits(worker)


def free_ip(
    db: Db,
    kind: DriverKind,
    cluster: str = DEFAULT_PREFIX,
    network: str = DEFAULT_NETWORK,
    worker: str = "",
) -> str:
    """On an isolating worker: an address in the worker's /96 of the app's network. Else a host
    command gets a loopback address (all of 127.0.0.0/8 is the host's). Drawn at random, so
    that the several workers of one host (as in `souk dev`) almost never draw the same."""
    prefix = worker_prefix(cluster, network, worker) if isolated() else None
    while True:
        a, b, c = os.urandom(3)
        if prefix is not None:
            host = int.from_bytes(os.urandom(4), "big")
            if host < 2:
                continue
            ip = str(prefix[host])
        elif kind == "command":
            ip = f"127.{a % 254 + 1}.{b}.{c % 254 + 1}"
        else:
            ip = f"10.{200 + a % 8}.{b}.{c % 253 + 2}"
        if not queries.ip_named(db, ip):
            return ip
