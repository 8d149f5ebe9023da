"""Private addresses: one of its own per machine, so that two machines of one app can bind one
port on one host."""

from __future__ import annotations

import os

from souk.worker import queries
from souk.worker.drivers.base import DriverKind
from souk.worker.queries import Db


def free_ip(db: Db, kind: DriverKind) -> str:
    """A host command gets a loopback address (all of 127.0.0.0/8 is the host's); a container
    gets one in 10.200.0.0/13, routed to its own network namespace. Drawn at random, so that the
    several workers of one host (as in `souk dev`) almost never draw the same."""
    while True:
        a, b, c = os.urandom(3)
        if kind == "command":
            ip = f"127.{a % 254 + 1}.{b}.{c % 254 + 1}"
        else:
            ip = f"10.{200 + a % 8}.{b}.{c % 253 + 2}"
        if not queries.ip_in_use(db, ip):
            return ip
