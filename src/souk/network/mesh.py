"""The WireGuard mesh between hosts (docs/network.md, "The mesh").

Each node (a worker's host) has a WireGuard key (0600 in its data directory), an interface of
its own and an address in the hosts' /72 of the cluster. Its public key, endpoint and address
are in its worker row (`MeshPeer`); every node configures every other as a peer, with the /96s
its machines' addresses are in (from the machine rows) as the peer's allowed IPs, and follows
the catalog's changes. The cluster's /48 is routed to the interface: what no local veth takes
goes to the peer whose allowed IPs hold it, and nowhere if none does.

Kernel WireGuard where the kernel has it; `wireguard-go` (a TUN device) where it does not: the
same `wg` configuration either way, chosen at start and logged. The interface outlives the
node's process (machines outlive their worker): a node started again takes it as it is.

The key rotates as a node's certificate does (`souk mesh rotate` writes a new one in its
place): a running node looks at the file every `RELOAD_INTERVAL` seconds, sets the new key on its
interface and says its new public key where its old one was said (its worker row, or its
announcement), and every peer replaces the old key by the new one as that arrives. A key the
file no longer holds is a peer of no one."""

from __future__ import annotations

import asyncio
import base64
import contextlib
import hashlib
import ipaddress
import logging
import shutil
import subprocess
import time
from collections.abc import Awaitable, Callable, Iterable
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.x25519 import X25519PrivateKey
from cryptography.hazmat.primitives.serialization import (
    Encoding,
    NoEncryption,
    PrivateFormat,
    PublicFormat,
)
from pydantic import BaseModel, ConfigDict, Field

from souk.catalog.bus import Bus, Message, Subscription
from souk.catalog.view import CatalogView
from souk.models.catalog import MachineRow, MeshPeer, WorkerRow
from souk.network.firewall import infra
from souk.secret_files import write_secret

log = logging.getLogger("souk.network.mesh")

ANNOUNCE_SUBJECT = "souk.mesh.announce"
ANNOUNCE_EVERY = 5.0  # seconds between a proxy host's announcements
ANNOUNCE_FOR = 20.0  # seconds an announcement holds
KEEPALIVE = 25  # seconds: keeps a NAT's mapping, and tells a peer this end's new address
SETTLE = 0.005  # seconds of quiet in the catalog's changes before the peers are set again
KEY_FILE = "mesh.key"  # in a worker's data directory, a proxy's --mesh-dir
RELOAD_INTERVAL = 2.0  # seconds between two looks at the key file, as at a node's certificate


def interface_name(node: str) -> str:
    """At most 15 bytes, and the node's own: wireguard-go's socket is named after it, in a
    directory every network namespace of the host shares."""
    return "skw" + hashlib.sha256(node.encode()).hexdigest()[:10]


def node_address(cluster: str, node: str) -> str:
    """The node's own address on the mesh, in the hosts' /72 (network bits zero)."""
    base = ipaddress.IPv6Network(cluster)
    bits = int.from_bytes(hashlib.sha256(node.encode()).digest()[:3], "big")
    return str(ipaddress.IPv6Address(int(base.network_address) | bits << 32 | 1))


def new_key() -> str:
    """A private key, base64 as `wg` reads it, with its newline."""
    raw = X25519PrivateKey.generate().private_bytes(Encoding.Raw, PrivateFormat.Raw, NoEncryption())
    return base64.b64encode(raw).decode() + "\n"


def public_of(private: str) -> str:
    """The public half of a base64 private key; ValueError if it is not one."""
    try:
        raw = base64.b64decode(private.strip(), validate=True)
        key = X25519PrivateKey.from_private_bytes(raw)
    except (ValueError, TypeError) as exc:
        raise ValueError(f"not a WireGuard private key: {exc}") from exc
    return base64.b64encode(key.public_key().public_bytes(Encoding.Raw, PublicFormat.Raw)).decode()


def load_key(path: Path) -> tuple[str, str]:
    """(private, public) keys, base64 as `wg` reads them; made once, 0600."""
    if not path.exists():
        with contextlib.suppress(FileExistsError):  # another start made it first
            write_secret(path, new_key(), replace=False)
    private = path.read_text().strip()
    return private, public_of(private)


def rotate_key(path: Path) -> tuple[str, str]:
    """A new key in place of the one at `path` (0600, atomically: a node reading it sees the old
    key or the new, never half of one): (old public key, new public key). FileNotFoundError if
    there is none: a node makes its own at its first start, and a path that holds none is a
    mistake, not a node."""
    old = public_of(path.read_text())
    private = new_key()
    write_secret(path, private)
    return old, public_of(private)


def _stamp(path: Path) -> tuple[int, int, int] | None:
    try:
        st = path.stat()
    except OSError:
        return None
    return (st.st_mtime_ns, st.st_size, st.st_ino)


def _run(*argv: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(argv, capture_output=True, text=True, check=False)


def _must(*argv: str) -> None:
    done = _run(*argv)
    if done.returncode != 0:
        raise MeshError(f"{' '.join(argv[:4])}: {done.stderr.strip()}")


class MeshError(RuntimeError):
    pass


def peers_of(
    me: str, workers: Iterable[WorkerRow], machines: Iterable[MachineRow]
) -> dict[str, tuple[str, list[str]]]:
    """Every other node's public key: (endpoint, allowed IPs): its own address and the /96 of
    each of its machines' addresses."""
    prefixes: dict[str, set[str]] = {}
    for row in machines:
        ip = row.private_ip
        if ip and ":" in ip and row.state != "destroyed":
            net = ipaddress.IPv6Network(f"{ip}/96", strict=False)
            prefixes.setdefault(row.worker_id, set()).add(str(net))
    found: dict[str, tuple[str, list[str]]] = {}
    for worker in workers:
        mesh = worker.mesh
        if worker.id == me or mesh is None:
            continue
        allowed = {f"{mesh.address}/128", *prefixes.get(worker.id, ())}
        found[mesh.public_key] = (mesh.endpoint, sorted(allowed))
    return found


class Mesh:
    """This node's interface and its peers."""

    def __init__(self, node: str, cluster: str, key: Path, port: int, endpoint: str) -> None:
        self.node = node
        self.cluster = cluster
        self.key = key
        self.port = port
        self.endpoint = endpoint
        self.interface = interface_name(node)
        self.address = node_address(cluster, node)
        self.private, self.public = load_key(key)
        self._stamp = _stamp(key)
        self.kind = ""
        self._peers: dict[str, tuple[str, list[str]]] = {}

    @property
    def peer(self) -> MeshPeer:
        """What its worker row says of it."""
        return MeshPeer(public_key=self.public, endpoint=self.endpoint, address=self.address)

    def start(self) -> None:
        """The interface (made, or found), its key, port, address and the cluster's route."""
        if _run("ip", "link", "show", self.interface).returncode != 0:
            if _run("ip", "link", "add", self.interface, "type", "wireguard").returncode == 0:
                self.kind = "kernel WireGuard"
            else:
                go = shutil.which("wireguard-go")
                if go is None:
                    raise MeshError("no kernel WireGuard and no wireguard-go (Debian package)")
                _must(go, self.interface)
                self.kind = "wireguard-go"
        else:
            self.kind = "found"
        self._set_key(self.private, "listen-port", str(self.port))
        _must("ip", "-6", "addr", "replace", f"{self.address}/128", "dev", self.interface)
        _must("ip", "link", "set", self.interface, "up")
        _must("ip", "-6", "route", "replace", self.cluster, "dev", self.interface)
        log.info(
            "mesh: %s on %s (%s), [%s], listening on %d, public key %s",
            self.node,
            self.interface,
            self.kind,
            self.address,
            self.port,
            self.public,
        )

    def _set_key(self, private: str, *more: str) -> None:
        """The interface's private key (`wg` reads it from its standard input: what it sets is
        what this node computed its public key from, whatever the file holds by then)."""
        argv = ("wg", "set", self.interface, "private-key", "/dev/stdin", *more)
        done = subprocess.run(argv, input=private + "\n", capture_output=True, text=True)
        if done.returncode != 0:
            raise MeshError(f"wg set {self.interface} private-key: {done.stderr.strip()}")

    def reload(self) -> bool:
        """The key file looked at: a new key there set on the interface (True). A file caught
        unreadable or holding no key leaves the key in use, said, and looked at again next time."""
        stamp = _stamp(self.key)
        if stamp is None or stamp == self._stamp:
            return False
        try:
            private = self.key.read_text().strip()
            public = public_of(private)
        except (OSError, ValueError) as exc:
            log.warning("mesh: %s changed but cannot be used: %s", self.key, exc)
            return False
        self._stamp = stamp
        if public == self.public:
            return False
        self._set_key(private)
        self.private, self.public = private, public
        log.info("mesh: %s rotated its key, public key now %s", self.node, public)
        return True

    def apply(self, peers: dict[str, tuple[str, list[str]]]) -> None:
        """The interface's peers made `peers`: new and changed ones set, then gone ones removed,
        so a host whose key rotated is never without a route (a new peer takes its addresses
        from the old one)."""
        for key, (endpoint, allowed) in peers.items():
            if self._peers.get(key) == (endpoint, allowed):
                continue
            _must(
                "wg", "set", self.interface, "peer", key, "endpoint", endpoint,
                "persistent-keepalive", str(KEEPALIVE), "allowed-ips", ",".join(allowed),
            )  # fmt: skip
        for key in set(self._peers) - set(peers):
            _run("wg", "set", self.interface, "peer", key, "remove")
        self._peers = dict(peers)

    def remove(self) -> None:
        """The interface deleted (wireguard-go ends with it): for tests and `souk` leaving."""
        _run("ip", "link", "del", self.interface)


class Announced:
    """Nodes on the mesh that own no catalog rows (proxies' hosts), as they announce themselves
    on the bus every `ANNOUNCE_EVERY` seconds; one unheard for `ANNOUNCE_FOR` is dropped."""

    def __init__(self, cluster: str) -> None:
        self.hosts = infra(ipaddress.IPv6Network(cluster))
        self.nodes: dict[str, tuple[MeshPeer, float]] = {}
        self.changed = asyncio.Event()

    def heard(self, data: bytes) -> None:
        """An announcement, taken only for an address of the hosts' /72: a machine's address
        claimed by one would take that machine's traffic (WireGuard gives an address to the
        peer that claimed it last)."""
        try:
            said = Announcement.model_validate_json(data)
            if ipaddress.IPv6Address(said.peer.address) not in self.hosts:
                return
        except ValueError:
            return
        known = self.nodes.get(said.node)
        self.nodes[said.node] = (said.peer, time.monotonic())
        if known is None or known[0] != said.peer:
            self.changed.set()

    def peers(self) -> dict[str, tuple[str, list[str]]]:
        now = time.monotonic()
        for node, (_, at) in list(self.nodes.items()):
            if now - at > ANNOUNCE_FOR:
                del self.nodes[node]
                self.changed.set()
        return {
            peer.public_key: (peer.endpoint, [f"{peer.address}/128"])
            for peer, _ in self.nodes.values()
        }

    async def listen(self, bus: Bus) -> Subscription:
        async def on(msg: Message) -> None:
            self.heard(msg.data)

        return await bus.subscribe(ANNOUNCE_SUBJECT, on)


class Announcement(BaseModel):
    model_config = ConfigDict(extra="ignore")
    node: str = Field(min_length=1, max_length=128)
    peer: MeshPeer


async def announce(bus: Bus, mesh: Mesh, again: asyncio.Event | None = None) -> None:
    """This node's place on the mesh, said on the bus every `ANNOUNCE_EVERY` (and at once when
    `again` is set: its key rotated), until cancelled."""
    again = again or asyncio.Event()
    while True:
        data = Announcement(node=mesh.node, peer=mesh.peer).model_dump_json().encode()
        with contextlib.suppress(Exception):  # a bus between connections: said again soon
            await bus.publish(ANNOUNCE_SUBJECT, data)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(again.wait(), ANNOUNCE_EVERY)
        again.clear()


async def keep_key(
    mesh: Mesh,
    rotated: Callable[[MeshPeer], Awaitable[None]],
    every: float = RELOAD_INTERVAL,
) -> None:
    """Looks at the key file every `every` seconds; a new key is set on the interface, then
    `rotated` is told the node's new place (to say it where the old was said), until cancelled.
    Told again at the next look if it failed."""
    told = True
    while True:
        await asyncio.sleep(every)
        try:
            if await asyncio.to_thread(mesh.reload):
                told = False
            if not told:
                await rotated(mesh.peer)
                told = True
        except Exception as exc:  # a rotation must never stop the next look
            log.warning("mesh: the new key is not said yet: %s", exc)


async def follow(mesh: Mesh, view: CatalogView, announced: Announced | None = None) -> None:
    """Sets the peers from the catalog (and those `announced`), then again at each change of a
    worker or machine (the changes that arrive together folded into one update), until
    cancelled."""
    changed = announced.changed if announced is not None else asyncio.Event()
    changed.set()

    async def watch() -> None:
        async for _ in view.subscribe(frozenset({"workers", "machines"})):
            changed.set()

    watcher = asyncio.ensure_future(watch())
    loop = asyncio.get_running_loop()
    try:
        while True:
            with contextlib.suppress(TimeoutError):  # and now and then: announced nodes expire
                await asyncio.wait_for(changed.wait(), ANNOUNCE_FOR)
            await asyncio.sleep(SETTLE)
            changed.clear()
            peers = peers_of(mesh.node, view.workers(reachable_only=False), view.machines())
            if announced is not None:
                peers.update(
                    (key, peer) for key, peer in announced.peers().items() if key != mesh.public
                )
            try:
                await loop.run_in_executor(None, mesh.apply, peers)
            except MeshError as exc:  # said, and tried again at the next change
                log.warning("mesh: setting the peers failed: %s", exc)
    finally:
        watcher.cancel()
