"""Isolation on a host, in nftables (docs/network.md, "Isolation"): one table, `inet souk`, whose
rules depend only on the cluster's prefix, and whose sets name each machine's veth, address and
private network, added when its namespace is made and removed with it. Every worker of a host
(as in `souk dev`) shares it; machines that are not on the private network are in no set and
its rules never match them.

- A machine sends only from its own addresses (its veth and address in `addrs`, and its IPv4
  one in `addrs4`), checked before any other rule, answers included: it neither poses as
  another machine of its host towards the internet's masquerade or the host, nor slips
  into another machine's connections.
- It reaches machines of its own network (`nets`: veth . network's /72), on any host, and the
  internet (IPv4, masqueraded by the host); nothing else private: not other networks, not other
  hosts' addresses, not its own host's services except its resolver's port 53.
- A machine is reached by machines of its network, and by the cluster's hosts (`infra`: the
  proxies and workers on the mesh) on its service ports only (`ports`: address . port, kept
  from the catalog by `souk.network.services`); from the internet only as answers.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
from pathlib import Path

from souk.network.nft import NftError, nft

log = logging.getLogger("souk.network.firewall")

TABLE = "inet souk"
EGRESS = "10.200.0.0/13"
PRIVATE4 = "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, 169.254.0.0/16, 127.0.0.0/8"

_ready: set[str] = set()
_lock = threading.Lock()
_made = 0  # tables this process made: each from nothing, with none of the sets' elements


def infra(cluster: ipaddress.IPv6Network) -> ipaddress.IPv6Network:
    """The hosts' own /72 of the cluster (its network bits all zero): mesh addresses."""
    return ipaddress.IPv6Network((int(cluster.network_address), 72))


PORTS = "type ipv6_addr . inet_service;"
ADDRS4 = "type ifname . ipv4_addr;"


def to_machine(cluster: ipaddress.IPv6Network) -> list[str]:
    """The rules of what reaches a machine (chain `to_machine`)."""
    return [
        "ct state established,related accept",
        "oifname . ip6 saddr @nets accept",
        f"ip6 saddr {infra(cluster)} ip6 daddr . th dport @ports accept",
        "drop",
    ]


# A packet of a machine from an address not its own: dropped in both chains it can reach.
SPOOFED6 = "meta nfproto ipv6 iifname . ip6 saddr != @addrs drop"
SPOOFED4 = "meta nfproto ipv4 iifname . ip saddr != @addrs4 drop"


def from_machine(cluster: ipaddress.IPv6Network) -> list[str]:
    """The rules of what a machine reaches through its host (chain `from_machine`)."""
    return [
        SPOOFED6,
        SPOOFED4,
        "ct state established,related accept",
        f"ip6 daddr {cluster} iifname . ip6 daddr @nets accept",
        "ip6 daddr { fc00::/7, fe80::/10, ::1 } drop",
        f"ip daddr {{ {PRIVATE4} }} drop",
    ]


def machine_to_host(resolver: str) -> list[str]:
    """The rules of what a machine reaches of its host itself (chain `machine_to_host`): its
    IPv6 sources are not checked here, where neighbour discovery comes from link-local ones."""
    return [
        SPOOFED4,
        "ct state established,related accept",
        "icmpv6 type { nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit } accept",
        f"ip6 daddr {resolver} meta l4proto {{ udp, tcp }} th dport 53 accept",
        "drop",
    ]


def ruleset(cluster: ipaddress.IPv6Network, resolver: str) -> str:
    reaching = "\n    ".join(to_machine(cluster))
    leaving = "\n    ".join(from_machine(cluster))
    to_host = "\n    ".join(machine_to_host(resolver))
    return f"""
table {TABLE} {{
  set veths {{ type ifname; }}
  set addrs {{ type ifname . ipv6_addr; }}
  set addrs4 {{ {ADDRS4} }}
  set nets {{ type ifname . ipv6_addr; flags interval; }}
  set ports {{ {PORTS} }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname @veths jump from_machine
    oifname @veths jump to_machine
  }}
  chain from_machine {{
    {leaving}
  }}
  chain to_machine {{
    {reaching}
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname @veths jump machine_to_host
  }}
  chain machine_to_host {{
    {to_host}
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {EGRESS} oifname != @veths masquerade
  }}
}}
"""


def made() -> int:
    """How many tables this process has made: when it changes, what a worker keeps in the
    table's sets is to be put there again."""
    return _made


def ensure(cluster: ipaddress.IPv6Network, resolver: str) -> None:
    """The table, made once per host (and per process, checked): a worker finding it made by
    another of the host's workers leaves it, with the others' machines in its sets."""
    global _made
    key = str(cluster)
    with _lock:
        if key in _ready:
            return
        try:
            nft().run(f"list table {TABLE}")
        except RuntimeError:
            nft().run(ruleset(cluster, resolver))
            _made += 1
            log.info("isolation: nftables table %s made for %s", TABLE, cluster)
        else:
            _upgrade(cluster)
            _upgrade_sources(cluster, resolver)
        _ready.add(key)


def _has_set(name: str) -> bool:
    try:
        nft().run(f"list set {TABLE} {name}")
    except RuntimeError:
        return False
    return True


def _chain(name: str, rules: list[str]) -> str:
    """Commands that make chain `name` hold `rules`, whatever it held before."""
    added = "".join(f"add rule {TABLE} {name} {rule}\n" for rule in rules)
    return f"add chain {TABLE} {name}\nflush chain {TABLE} {name}\n{added}"


def _upgrade(cluster: ipaddress.IPv6Network) -> None:
    """A table of the release before, whose hosts reached every port of a machine: its
    `to_machine` rules replaced in one transaction, its machines' elements kept."""
    if _has_set("ports"):
        return
    nft().run(f"add set {TABLE} ports {{ {PORTS} }}\n" + _chain("to_machine", to_machine(cluster)))
    log.info("isolation: %s upgraded: hosts reach machines' service ports only", TABLE)


def _upgrade_sources(cluster: ipaddress.IPv6Network, resolver: str) -> None:
    """A table of the release before, which checked no IPv4 source (and IPv6 ones only after
    the connections' answers): `addrs4` made and filled, in the same transaction as the
    rules, with the IPv4 address each running machine's veth is routed (`routed4`), so that
    none of them loses its traffic; its other elements kept."""
    if _has_set("addrs4"):
        return
    elements = "".join(
        f"add element {TABLE} addrs4 {{ {veth} . {address} }}\n" for veth, address in routed4()
    )
    nft().run(
        f"add set {TABLE} addrs4 {{ {ADDRS4} }}\n"
        + elements
        + _chain("from_machine", from_machine(cluster))
        + _chain("machine_to_host", machine_to_host(resolver))
    )
    log.info("isolation: %s upgraded: machines' IPv4 sources checked", TABLE)


def routed4() -> list[tuple[str, str]]:
    """(interface, address) of the host's routes to single addresses of `EGRESS`: where the
    host sends each machine's IPv4 address, read from this thread's network namespace."""
    egress = ipaddress.IPv4Network(EGRESS)
    found: list[tuple[str, str]] = []
    try:
        lines = Path("/proc/thread-self/net/route").read_text().splitlines()[1:]
    except OSError:
        return found
    for line in lines:
        fields = line.split()
        if len(fields) < 8 or fields[7] != "FFFFFFFF":
            continue
        address = ipaddress.IPv4Address(bytes.fromhex(fields[1])[::-1])  # little-endian
        if address in egress:
            found.append((fields[0], str(address)))
    return found


def admit(
    veth: str, address: str, ipv4: str, cluster: ipaddress.IPv6Network, resolver: str
) -> None:
    """A machine's veth, addresses and network into the sets (there already is fine), the table
    made first if it is not there. A table these elements do not go into (flushed, or not
    souk's) is made again from nothing: its other machines lose their elements, and with them
    every connection (closed, not open), until each starts again (`setup` admits it anew)."""
    network = ipaddress.IPv6Network(f"{address}/72", strict=False)
    elements = (
        f"add element {TABLE} veths {{ {veth} }}\n"
        f"add element {TABLE} addrs {{ {veth} . {address} }}\n"
        f"add element {TABLE} addrs4 {{ {veth} . {ipv4} }}\n"
        f"add element {TABLE} nets {{ {veth} . {network} }}\n"
    )
    ensure(cluster, resolver)
    try:
        nft().run(elements)
    except NftError as exc:
        log.warning("isolation: %s: table %s made again", exc, TABLE)
        reset()
        ensure(cluster, resolver)
        nft().run(elements)


def forget(veth: str) -> None:
    """The machine's elements out of the sets (its namespace is going)."""
    found = ""
    for name in ("addrs", "addrs4", "nets"):  # one listing a command: libnftables refuses two
        try:
            found += nft().run(f"list set {TABLE} {name}")
        except RuntimeError:
            continue  # no table, or one of the release before
    commands = []
    for name, element in _elements(found, veth):
        commands.append(f"delete element {TABLE} {name} {{ {element} }}")
    commands.append(f"delete element {TABLE} veths {{ {veth} }}")
    for command in commands:
        try:
            nft().run(command)
        except RuntimeError:
            continue  # gone already


def _elements(listing: str, veth: str) -> list[tuple[str, str]]:
    """(set, element) of `veth` in `nft list set` output."""
    found: list[tuple[str, str]] = []
    current = ""
    for line in listing.replace(",", "\n").replace("{", "\n").replace("}", "\n").splitlines():
        text = line.strip()
        if text.startswith("set "):
            current = text.split()[1]
        elif text.startswith("elements ="):
            text = text.removeprefix("elements =").strip()
        if current and text.startswith(f'"{veth}" .'):
            found.append((current, text))
    return found


def reset() -> None:
    """The table removed (tests, and `souk` on a host it leaves)."""
    with _lock:
        _ready.clear()
        try:
            nft().run(f"delete table {TABLE}")
        except RuntimeError:
            pass
