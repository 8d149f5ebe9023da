"""Isolation on a host, in nftables (docs/network.md, "Isolation"): one table, `inet souk`, whose
rules depend only on the cluster's prefix, and whose sets name each machine's veth, address and
private network, added when its namespace is made and removed with it. Every worker of a host
(as in `souk dev`) shares it; machines that are not on the private network are in no set and
its rules never match them.

- A machine sends only from its own address (its veth and address in `addrs`).
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

from souk.network.nft import NftError, nft

log = logging.getLogger("souk.network.firewall")

TABLE = "inet souk"
EGRESS = "10.200.0.0/13"
PRIVATE4 = "10.0.0.0/8, 172.16.0.0/12, 192.168.0.0/16, 100.64.0.0/10, 169.254.0.0/16, 127.0.0.0/8"

_ready: set[str] = set()
_lock = threading.Lock()


def infra(cluster: ipaddress.IPv6Network) -> ipaddress.IPv6Network:
    """The hosts' own /72 of the cluster (its network bits all zero): mesh addresses."""
    return ipaddress.IPv6Network((int(cluster.network_address), 72))


PORTS = "type ipv6_addr . inet_service;"


def to_machine(cluster: ipaddress.IPv6Network) -> list[str]:
    """The rules of what reaches a machine (chain `to_machine`)."""
    return [
        "ct state established,related accept",
        "oifname . ip6 saddr @nets accept",
        f"ip6 saddr {infra(cluster)} ip6 daddr . th dport @ports accept",
        "drop",
    ]


def ruleset(cluster: ipaddress.IPv6Network, resolver: str) -> str:
    reaching = "\n    ".join(to_machine(cluster))
    return f"""
table {TABLE} {{
  set veths {{ type ifname; }}
  set addrs {{ type ifname . ipv6_addr; }}
  set nets {{ type ifname . ipv6_addr; flags interval; }}
  set ports {{ {PORTS} }}
  chain forward {{
    type filter hook forward priority filter; policy accept;
    iifname @veths jump from_machine
    oifname @veths jump to_machine
  }}
  chain from_machine {{
    ct state established,related accept
    meta nfproto ipv6 iifname . ip6 saddr != @addrs drop
    ip6 daddr {cluster} iifname . ip6 daddr @nets accept
    ip6 daddr {{ fc00::/7, fe80::/10, ::1 }} drop
    ip daddr {{ {PRIVATE4} }} drop
  }}
  chain to_machine {{
    {reaching}
  }}
  chain input {{
    type filter hook input priority filter; policy accept;
    iifname @veths jump machine_to_host
  }}
  chain machine_to_host {{
    ct state established,related accept
    icmpv6 type {{ nd-neighbor-solicit, nd-neighbor-advert, nd-router-solicit }} accept
    ip6 daddr {resolver} meta l4proto {{ udp, tcp }} th dport 53 accept
    drop
  }}
  chain postrouting {{
    type nat hook postrouting priority srcnat; policy accept;
    ip saddr {EGRESS} oifname != @veths masquerade
  }}
}}
"""


def ensure(cluster: ipaddress.IPv6Network, resolver: str) -> None:
    """The table, made once per host (and per process, checked): a worker finding it made by
    another of the host's workers leaves it, with the others' machines in its sets."""
    key = str(cluster)
    with _lock:
        if key in _ready:
            return
        try:
            nft().run(f"list table {TABLE}")
        except RuntimeError:
            nft().run(ruleset(cluster, resolver))
            log.info("isolation: nftables table %s made for %s", TABLE, cluster)
        else:
            _upgrade(cluster)
        _ready.add(key)


def _upgrade(cluster: ipaddress.IPv6Network) -> None:
    """A table of the release before, whose hosts reached every port of a machine: its
    `to_machine` rules replaced in one transaction, its machines' elements kept."""
    try:
        nft().run(f"list set {TABLE} ports")
        return
    except RuntimeError:
        pass
    rules = "".join(f"add rule {TABLE} to_machine {rule}\n" for rule in to_machine(cluster))
    nft().run(f"add set {TABLE} ports {{ {PORTS} }}\nflush chain {TABLE} to_machine\n{rules}")
    log.info("isolation: %s upgraded: hosts reach machines' service ports only", TABLE)


def admit(veth: str, address: str, cluster: ipaddress.IPv6Network, resolver: str) -> None:
    """A machine's veth, address and network into the sets (there already is fine), the table
    made first if it is not there. A table these elements do not go into (flushed, or not
    souk's) is made again from nothing: its other machines lose their elements, and with them
    every connection (closed, not open), until each starts again (`setup` admits it anew)."""
    network = ipaddress.IPv6Network(f"{address}/72", strict=False)
    elements = (
        f"add element {TABLE} veths {{ {veth} }}\n"
        f"add element {TABLE} addrs {{ {veth} . {address} }}\n"
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
    try:  # one listing a command: libnftables refuses two in one buffer
        found = nft().run(f"list set {TABLE} addrs") + nft().run(f"list set {TABLE} nets")
    except RuntimeError:
        return
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
