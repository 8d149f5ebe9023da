"""Metadata keys and values more than one part reads or writes: a deploy marks machines, the
broker cordons them, the proxy routes by those marks. Spelled here only, so that a writer and
its readers cannot drift apart."""

from __future__ import annotations

import ipaddress
from typing import Literal

ROLE_KEY = "souk.role"  # a deploy's machine: its part in its instance (see Role)
RELEASE_KEY = "souk.release"  # a deploy's machine: the release number it runs
NETWORK_KEY = "souk.network"  # an app's: the private network it was created on (network.md)
# The network of apps of the default org created on none: what a create that names no network
# is on (a broker leaves it out, so that a worker of the release before takes the create).
DEFAULT_NETWORK = "personal/default"
# The cluster's /48 of private addresses unless one is set: "souk" in its global id. Several
# clusters that may ever be joined should each set a random one (RFC 4193: fd, 40 random bits).
DEFAULT_PRIVATE_PREFIX = "fd73:6f75:6b00::/48"


def private_prefix_error(prefix: str) -> str | None:
    """Why `prefix` cannot be a cluster's private prefix (a ULA /48), or None."""
    try:
        net = ipaddress.IPv6Network(prefix)
    except ValueError as exc:
        return f"{prefix!r} is not an IPv6 prefix: {exc}"
    if net.prefixlen != 48 or not net.subnet_of(ipaddress.IPv6Network("fc00::/7")):
        return f"{prefix} is not a /48 of unique local addresses (fc00::/7), as fd12:3456:789a::/48"
    return None


HIDDEN_KEY = "souk.hidden"  # "true": the proxy sends it no traffic (blue/green before the switch)
CORDON_KEY = "souk_cordoned"  # "true": a machine cordon, out of the proxy's rotation
# App metadata: the broker stores values of keys under this prefix encrypted, and shows them only
# to tokens that may deploy the app (a deploy keeps each release's environment there).
SEALED_PREFIX = "sealed."

Role = Literal["primary", "standby", "canary"]

# The version of the internal protocol (the worker API, reservation calls, catalog messages)
# this souk speaks. A part accepts a peer one version behind or ahead of its own, so that in a
# rolling upgrade any part can be upgraded before or after any other: a change to the protocol is
# additive for one release (what an older peer does not know, it ignores), and needs no answer a
# peer one version back cannot give. 0 is every release from before versions were sent.
PROTOCOL = 1
PROTOCOL_HEADER = "souk-protocol"  # on every worker API request and answer


def protocol_accepted(version: int) -> bool:
    """Whether a peer speaking `version` can be understood, and understand us."""
    return abs(version - PROTOCOL) <= 1
