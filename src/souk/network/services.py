"""Which ports of a machine the cluster's hosts reach (docs/network.md, "Isolation"): its
services' internal ports and its metrics port, nothing else. A proxy on another host reaches a
machine over the mesh from the hosts' /72; the rule that lets it in (`souk.network.firewall`)
matches the machine's address and port in the set `ports`, which each worker keeps for its own
machines from the catalog (their rows name their ports), as it keeps its peers: set at once,
then again at each change of a machine row. A machine's row exists from its create, before it
first starts, so its ports are open to hosts before anything could be routed to it.

Machines of one private network reach each other on every port, whatever this set holds."""

from __future__ import annotations

import asyncio
import ipaddress
import logging
import re
from collections.abc import Iterable

from souk.catalog.view import CatalogView
from souk.models.catalog import MachineRow
from souk.network import firewall
from souk.network.firewall import TABLE
from souk.network.nft import nft

log = logging.getLogger("souk.network.services")

Element = tuple[str, int]  # (machine address, port)
SETTLE = 0.005  # seconds of quiet in the catalog's changes before the set is updated
RETRY = 1.0  # seconds before a set that could not be made what the catalog says is tried again


def wanted(worker: str, cluster: ipaddress.IPv6Network, rows: Iterable[MachineRow]) -> set[Element]:
    """The (address, port) pairs the hosts may reach of `worker`'s machines: each live one with
    an address on the private network, at its services' ports and its metrics port."""
    found: set[Element] = set()
    for row in rows:
        ip = row.private_ip
        if row.worker_id != worker or row.state == "destroyed" or not ip or ":" not in ip:
            continue
        if ipaddress.IPv6Address(ip) not in cluster:
            continue
        address = str(ipaddress.IPv6Address(ip))
        ports = set(row.ports)
        if row.metrics is not None and row.metrics.port is not None:
            ports.add(row.metrics.port)
        found.update((address, port) for port in ports)
    return found


ELEMENT = re.compile(r"([0-9a-fA-F:]+) \. (\d+)")


def listed() -> set[Element]:
    """The set's elements as they are (a table of another release without it: none)."""
    try:
        out = nft().run(f"list set {TABLE} ports")
    except RuntimeError:
        return set()
    body = out.split("elements =", 1)[1] if "elements =" in out else ""
    return {(str(ipaddress.IPv6Address(a)), int(p)) for a, p in ELEMENT.findall(body)}


def _run(command: str, elements: Iterable[Element]) -> set[Element]:
    """One transaction per element, so that one that fails fails alone; those that failed."""
    failed: set[Element] = set()
    for address, port in sorted(elements):
        try:
            nft().run(f"{command} element {TABLE} ports {{ {address} . {port} }}")
        except RuntimeError as exc:
            log.debug("isolation: %s %s . %d: %s", command, address, port, exc)
            failed.add((address, port))
    return failed


class Ports:
    """A worker's machines' elements of the set: what it has put there, made what the catalog
    says at each `update`. The set is read only when something is to change (every machine row
    of the cluster calls an update): when the catalog asks for other elements, when an element
    could not be added, and when the table was made again from nothing (`firewall.admit`),
    which then has none of them; what it lacks is added, whatever was put there before."""

    def __init__(self, worker: str, cluster: str) -> None:
        self.worker = worker
        self.cluster = ipaddress.IPv6Network(cluster)
        self.held: set[Element] | None = None
        self.table = firewall.made()

    def update(self, rows: Iterable[MachineRow]) -> None:
        rows = list(rows)
        want = wanted(self.worker, self.cluster, rows)
        table = firewall.made()
        if want == self.held and table == self.table:
            return
        self.table = table
        present = listed()
        if self.held is None:  # first look: its own from before a restart, by their /96s
            mine = {ipaddress.IPv6Network(f"{a}/96", strict=False) for a, _ in want}
            mine |= {
                ipaddress.IPv6Network(f"{r.private_ip}/96", strict=False)
                for r in rows
                if r.worker_id == self.worker and r.private_ip and ":" in r.private_ip
            }
            self.held = {e for e in present if any(ipaddress.IPv6Address(e[0]) in n for n in mine)}
        _run("delete", (self.held - want) & present)
        failed = _run("add", want - present)
        self.held = want - failed
        if failed:
            raise RuntimeError(f"{len(failed)} of its machines' ports not in {TABLE}")


async def follow(worker: str, cluster: str, view: CatalogView) -> None:
    """Keeps `worker`'s machines' service ports in the set from `view`, until cancelled."""
    ports = Ports(worker, cluster)
    changed = asyncio.Event()
    changed.set()

    async def watch() -> None:
        async for _ in view.subscribe(frozenset({"machines"})):
            changed.set()

    watcher = asyncio.ensure_future(watch())
    try:
        while True:
            await changed.wait()
            await asyncio.sleep(SETTLE)
            changed.clear()
            try:
                await asyncio.to_thread(ports.update, view.machines())
            except RuntimeError as exc:  # said, and tried again shortly
                log.warning("isolation: the service ports were not set: %s", exc)
                asyncio.get_running_loop().call_later(RETRY, changed.set)
    finally:
        watcher.cancel()
