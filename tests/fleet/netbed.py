"""A network of hosts on one machine: a network namespace per host, all on one Linux bridge.

The bridge lives in a namespace of its own (the hub), so that neither the bridge nor the
fleet's private /24 ever appears in the machine's own network namespace. The hub also holds the
observer's address (`.1`, on the bridge): the tests, like an operator, reach every host from
there through `Observer`, a thread pool whose threads have entered the hub's namespace.

Faults are real: a cut link is the hub's end of a host's veth pair set down (the host sees
NO-CARRIER and its packets go nowhere), and dropped packets are nftables rules in the bridge's
forward hook, in the hub, so that the hosts' own tables stay untouched and one flush heals all.
Traffic between the observer and a host crosses the bridge's input and output hooks, not
forward: drop rules never blind the observer, a cut link does.

Every namespace is named `skf<pid>-<host>` after the process that owns it, so that a later run
can tell leftovers (their owner is gone) from a fleet still in use.
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import os
import re
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TypeVar

PREFIX = "skf"
SUBNET = "10.77.0"
OBSERVER = f"{SUBNET}.1"
BRIDGE = "skfbr"
TABLE = "skf"  # the hub's nftables table (family bridge)
CLONE_NEWNET = 0x40000000
_OWNED = re.compile(rf"^{PREFIX}(\d+)-")

T = TypeVar("T")


def run(*argv: str, check: bool = True) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"{' '.join(argv)}: {done.stderr.strip() or done.returncode}")
    return done.stdout


def unavailable() -> str | None:
    """Why a bed cannot be built here, or None: root, `ip netns` and `nft` are needed."""
    if os.geteuid() != 0:
        return "network namespaces need root"
    for tool in ("ip", "nft"):
        if shutil.which(tool) is None:
            return f"`{tool}` is not installed (scripts/setup.sh installs it)"
    probe = f"{PREFIX}{os.getpid()}-probe"
    try:
        run("ip", "netns", "add", probe)
    except RuntimeError as exc:
        return f"`ip netns add` fails here: {exc}"
    try:
        run("ip", "netns", "exec", probe, "nft", "list", "tables")
    except RuntimeError as exc:
        return f"nftables is unavailable in a namespace: {exc}"
    finally:
        run("ip", "netns", "delete", probe, check=False)
    return None


def namespaces() -> list[str]:
    out = run("ip", "netns", "list", check=False)
    return [line.split()[0] for line in out.splitlines() if line.strip()]


def ns_pids(ns: str) -> list[int]:
    return [int(p) for p in run("ip", "netns", "pids", ns, check=False).split()]


def _alive(pid: int) -> bool:
    """Running, not a zombie (a killed owner whose parent is gone may linger as one)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            stat = f.read()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def remove_namespace(ns: str) -> None:
    """Kill every process in it (twice: one may be forking), then delete it."""
    for _ in range(2):
        for pid in ns_pids(ns):
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        time.sleep(0.05)
    run("ip", "netns", "delete", ns, check=False)


def clean_leftovers(everything: bool = False) -> list[str]:
    """Remove the namespaces of beds whose owner process is gone (all of them if
    `everything`); returns their names."""
    gone = []
    for ns in namespaces():
        owned = _OWNED.match(ns)
        if owned is None:
            continue
        owner = int(owned.group(1))
        if everything or (owner != os.getpid() and not _alive(owner)):
            remove_namespace(ns)
            gone.append(ns)
    return gone


def enter(ns: str) -> None:
    """Move the calling thread (only it: a network namespace is per thread) into `ns`."""
    libc = ctypes.CDLL(None, use_errno=True)
    fd = os.open(f"/run/netns/{ns}", os.O_RDONLY)
    try:
        if libc.setns(fd, CLONE_NEWNET) != 0:
            err = ctypes.get_errno()
            raise OSError(err, f"setns {ns}: {os.strerror(err)}")
    finally:
        os.close(fd)


class Observer:
    """Calls made from the hub's namespace: sockets belong to the namespace of the thread that
    opens them, so every call runs on one of these threads."""

    def __init__(self, ns: str, threads: int = 8) -> None:
        self.pool = ThreadPoolExecutor(threads, f"{ns}-observer", initializer=enter, initargs=(ns,))

    def __call__(self, fn: Callable[..., T], *args: object) -> T:
        return self.pool.submit(fn, *args).result()

    def close(self) -> None:
        self.pool.shutdown(wait=False, cancel_futures=True)


@dataclass(frozen=True)
class Host:
    name: str
    ns: str
    address: str
    port: str  # the hub's end of its veth pair, a port of the bridge


@dataclass(frozen=True)
class Cut:
    """Rules dropping packets; `restore()` removes them and nothing else."""

    bed: NetBed
    handles: tuple[int, ...]
    what: str

    def restore(self) -> None:
        for handle in self.handles:
            self.bed.hub_run(f"nft delete rule bridge {TABLE} forward handle {handle}")
        self.bed.cuts.discard(self)


class Flap:
    """A link going down and up again until stopped; it is left up."""

    def __init__(self, bed: NetBed, host: str, down_for: float, up_for: float) -> None:
        self.bed, self.host = bed, host
        self.down_for, self.up_for = down_for, up_for
        self.stopped = threading.Event()
        self.flips = 0
        self.thread = threading.Thread(target=self._run, name=f"flap-{host}", daemon=True)
        self.thread.start()

    def _run(self) -> None:
        while not self.stopped.is_set():
            self.bed.link_down(self.host)
            self.flips += 1
            self.stopped.wait(self.down_for)
            self.bed.link_up(self.host)
            self.stopped.wait(self.up_for)

    def stop(self) -> None:
        self.stopped.set()
        self.thread.join()
        self.bed.link_up(self.host)


class NetBed:
    """Hosts in namespaces on one bridge, and the faults between them.

    `up()` first removes the leftovers of earlier beds; `down()` (also run at exit) kills every
    process of every namespace of this bed and deletes them."""

    def __init__(self, owner: int | None = None) -> None:
        self.run_id = f"{PREFIX}{owner or os.getpid()}"
        self.hub = f"{self.run_id}-hub"
        self.hosts: dict[str, Host] = {}
        self.cuts: set[Cut] = set()
        self.flaps: list[Flap] = []
        self.observer: Observer | None = None

    # --- building ----------------------------------------------------------------------------

    def up(self) -> NetBed:
        clean_leftovers()
        atexit.register(self.down)
        run("ip", "netns", "add", self.hub)
        self.hub_run("ip link set lo up")
        self.hub_run(f"ip link add {BRIDGE} type bridge")
        self.hub_run(f"ip addr add {OBSERVER}/24 dev {BRIDGE}")
        self.hub_run(f"ip link set {BRIDGE} up")
        self.hub_run(f"nft add table bridge {TABLE}")
        self.hub_run(
            f"nft add chain bridge {TABLE} forward"
            " { type filter hook forward priority 0 ; policy accept ; }"
        )
        self.observer = Observer(self.hub)
        return self

    def add_host(self, name: str, last_octet: int) -> Host:
        """A namespace `skf<pid>-<name>` with `eth0` at 10.77.0.<last_octet>/24 on the bridge."""
        assert name not in self.hosts and 1 < last_octet < 255
        ns, port = f"{self.run_id}-{name}", f"v-{name}"[:15]
        address = f"{SUBNET}.{last_octet}"
        run("ip", "netns", "add", ns)
        self.hub_run(f"ip link add {port} type veth peer name eth0 netns {ns}")
        self.hub_run(f"ip link set {port} master {BRIDGE} up")
        run("ip", "-n", ns, "addr", "add", f"{address}/24", "dev", "eth0")
        run("ip", "-n", ns, "link", "set", "eth0", "up")
        run("ip", "-n", ns, "link", "set", "lo", "up")
        host = Host(name, ns, address, port)
        self.hosts[name] = host
        return host

    def hub_run(self, command: str) -> str:
        """A command in the hub's namespace; its words are split on spaces."""
        return run("ip", "netns", "exec", self.hub, *command.split())

    def argv_in(self, host: str, argv: list[str]) -> list[str]:
        """`argv` run in the host's namespace (`ip netns exec` execs it: same pid)."""
        return ["ip", "netns", "exec", self.hosts[host].ns, *argv]

    def pids(self, host: str) -> list[int]:
        return ns_pids(self.hosts[host].ns)

    def call(self, fn: Callable[..., T], *args: object) -> T:
        """`fn(*args)` from the observer's address."""
        assert self.observer is not None, "the bed is not up"
        return self.observer(fn, *args)

    # --- faults ------------------------------------------------------------------------------

    def link_down(self, host: str) -> None:
        """Pull the host's cable: nobody reaches it, it reaches nobody (not even the observer)."""
        self.hub_run(f"ip link set {self.hosts[host].port} down")

    def link_up(self, host: str) -> None:
        self.hub_run(f"ip link set {self.hosts[host].port} up")

    def drop(self, src: str | list[str], dst: str | list[str], *, one_way: bool = False) -> Cut:
        """Drop every packet from each `src` host to each `dst` host and, unless `one_way`,
        back: `one_way` is an asymmetric link (requests arrive, nothing answers)."""
        srcs = [src] if isinstance(src, str) else src
        dsts = [dst] if isinstance(dst, str) else dst
        pairs = [(a, b) for a in srcs for b in dsts]
        if not one_way:
            pairs += [(b, a) for a, b in pairs]
        handles = []
        for a, b in pairs:
            out = self.hub_run(
                f"nft --echo --handle add rule bridge {TABLE} forward"
                f" ip saddr {self.hosts[a].address} ip daddr {self.hosts[b].address} drop"
            )
            found = re.search(r"# handle (\d+)", out)
            assert found, f"no handle in nft's echo: {out!r}"
            handles.append(int(found.group(1)))
        arrow = "->" if one_way else "<->"
        cut = Cut(self, tuple(handles), f"{srcs} {arrow} {dsts}")
        self.cuts.add(cut)
        return cut

    def flap(self, host: str, down_for: float = 1.0, up_for: float = 1.0) -> Flap:
        flap = Flap(self, host, down_for, up_for)
        self.flaps.append(flap)
        return flap

    @contextlib.contextmanager
    def dropping(
        self, src: str | list[str], dst: str | list[str], *, one_way: bool = False
    ) -> Iterator[Cut]:
        cut = self.drop(src, dst, one_way=one_way)
        try:
            yield cut
        finally:
            cut.restore()

    def heal(self) -> None:
        """Every flap stopped, every link up, every drop rule gone."""
        for flap in self.flaps:
            flap.stop()
        self.flaps.clear()
        for host in self.hosts:
            self.link_up(host)
        self.hub_run(f"nft flush chain bridge {TABLE} forward")
        self.cuts.clear()

    def ruleset(self) -> str:
        return self.hub_run("nft list ruleset")

    # --- teardown ----------------------------------------------------------------------------

    def down(self) -> None:
        for flap in self.flaps:
            flap.stopped.set()
        if self.observer is not None:
            self.observer.close()
            self.observer = None
        for host in self.hosts.values():
            remove_namespace(host.ns)
        self.hosts.clear()
        remove_namespace(self.hub)
        atexit.unregister(self.down)
