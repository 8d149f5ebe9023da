"""Each machine's own network namespace, joined to the host by a veth pair: the machine holds its
private address on eth0; the host routes that /32 (/128) to the veth and answers ARP (neighbour
discovery) for the machine's gateway (each veth holds that link-local address), so no bridge or
shared subnet is needed.

A machine on the private network (docs/network.md) has an IPv6 address there, its
`private_ip`, and beside it an IPv4 address of the host's own (10.200.0.0/13, drawn here, never
stored: it only carries the machine's traffic to the internet, masqueraded by the host): the
host's route to it is added exclusively, so two workers of one host never hand out the same one.

All of it is made by the worker itself, with system calls and rtnetlink messages (what `ip` would
send), not by running `ip`: about two milliseconds in all, where two `ip -batch` runs took 12-19.
A thread that enters a namespace (`unshare`, `setns`) is a fresh one that ends after: a namespace
is the calling thread's own, and no other thread of the worker ever runs in the machine's.

The namespace is named (`/var/run/netns/souk-<machine id>`, as `ip netns add` would) before
anything is made in it, and the machine's address inside is made last: a worker killed midway
leaves a namespace that `teardown` finds by its name, and that `setup` does not take for
complete."""

from __future__ import annotations

import asyncio
import ctypes
import ctypes.util
import errno as errnos
import fcntl
import hashlib
import ipaddress
import logging
import os
import socket
import struct
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TypeVar

from souk.network import firewall
from souk.secret_files import write_file
from souk.worker.threads import to_thread_to_its_end

GATEWAY = "169.254.1.1"  # what machines route through; answered by the host's proxy ARP
GATEWAY6 = "fe80::1"  # the same for IPv6: each veth's own link-local address
EGRESS = ipaddress.IPv4Network("10.200.0.0/13")  # machines' IPv4 addresses, for the internet
NETNS_DIR = Path("/var/run/netns")

T = TypeVar("T")
_libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
CLONE_NEWNET = 0x40000000
MS_BIND, MS_REC, MS_SHARED, MNT_DETACH = 0x1000, 0x4000, 1 << 20, 2
SIOCGIFADDR = 0x8915

# rtnetlink (linux/netlink.h, linux/rtnetlink.h, linux/if_link.h, linux/veth.h)
NLMSG_ERROR = 2
RTM_NEWLINK, RTM_DELLINK, RTM_NEWADDR, RTM_NEWROUTE = 16, 17, 20, 24
NLM_F_REQUEST, NLM_F_ACK, NLM_F_REPLACE, NLM_F_EXCL, NLM_F_CREATE = 1, 4, 0x100, 0x200, 0x400
IFA_F_NODAD = 0x02  # an address usable at once: no duplicate detection on a link of two
IFLA_IFNAME, IFLA_LINKINFO, IFLA_NET_NS_FD = 3, 18, 28
IFLA_INFO_KIND, IFLA_INFO_DATA, VETH_INFO_PEER = 1, 2, 1
IFA_ADDRESS, IFA_LOCAL = 1, 2
RTA_DST, RTA_OIF, RTA_GATEWAY = 1, 4, 5
IFF_UP = 1
RT_TABLE_MAIN, RTPROT_BOOT, RTN_UNICAST = 254, 3, 1
RT_SCOPE_UNIVERSE, RT_SCOPE_LINK = 0, 253
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, sequence, port
_IFINFOMSG = struct.Struct("=BxHiII")  # family, type, index, flags, change
_IFADDRMSG = struct.Struct("=BBBBI")  # family, prefix length, flags, scope, interface index
_RTMSG = struct.Struct("=BBBBBBBBI")  # family, dst/src length, tos, table, protocol, scope, type

_netns_dir_ready = False
_forwarding_checked = False
log = logging.getLogger("souk.worker.network")
_netns_dir_lock = threading.Lock()


class NetworkError(RuntimeError):
    def __init__(self, message: str, errno: int = 0) -> None:
        super().__init__(message)
        self.errno = errno


class RouteTaken(NetworkError):
    """The host routes that address elsewhere already (another machine of another worker)."""


def names(machine_id: str) -> tuple[str, str]:
    """(namespace name, host-side veth name); interface names are at most 15 bytes."""
    short = hashlib.sha256(machine_id.encode()).hexdigest()[:10]
    return f"souk-{machine_id}", f"sk{short}"


def _conf(veth: str) -> Path:
    """The link's settings in this thread's network namespace (unlike /sys/class/net)."""
    return Path("/proc/sys/net/ipv4/conf") / veth


# -- rtnetlink -------------------------------------------------------------------------------


def _attr(kind: int, data: bytes) -> bytes:
    length = 4 + len(data)
    return struct.pack("=HH", length, kind) + data + b"\0" * (-length % 4)


def _name(name: str) -> bytes:
    return name.encode() + b"\0"


def _packed(address: str) -> tuple[int, bytes]:
    """(family, bytes) of an IPv4 or IPv6 address."""
    ip = ipaddress.ip_address(address)
    return (socket.AF_INET if ip.version == 4 else socket.AF_INET6), ip.packed


class _Netlink:
    """An rtnetlink socket, in the network namespace of the thread that opened it (for good)."""

    def __init__(self) -> None:
        self.sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, socket.NETLINK_ROUTE)
        self.sock.settimeout(5)
        self.seq = 0

    def __enter__(self) -> _Netlink:
        return self

    def __exit__(self, *exc: object) -> None:
        self.sock.close()

    def request(self, kind: int, flags: int, body: bytes, ok: tuple[int, ...] = ()) -> None:
        """One request, and its acknowledgement; errors in `ok` (as errnos) count as done."""
        self.seq += 1
        flags |= NLM_F_REQUEST | NLM_F_ACK
        self.sock.send(_HEADER.pack(_HEADER.size + len(body), kind, flags, self.seq, 0) + body)
        while True:
            reply = self.sock.recv(65536)
            _, answer, _, seq, _ = _HEADER.unpack_from(reply)
            if answer == NLMSG_ERROR and seq == self.seq:
                break
        (code,) = struct.unpack_from("=i", reply, _HEADER.size)
        if code != 0 and -code not in ok:
            raise NetworkError(f"rtnetlink message {kind}: {os.strerror(-code)}", -code)

    def link_up(self, index: int) -> None:
        self.request(RTM_NEWLINK, 0, _IFINFOMSG.pack(socket.AF_UNSPEC, 0, index, IFF_UP, IFF_UP))

    def add_address(self, index: int, address: str, length: int | None = None) -> None:
        """`ip addr add <address>/32 dev <index>` (/128 for IPv6, with no duplicate address
        detection, or /`length` in the link's scope); there already is fine."""
        family, packed = _packed(address)
        full = len(packed) * 8
        scope = RT_SCOPE_LINK if packed[:2] == b"\xfe\x80" else RT_SCOPE_UNIVERSE
        flags = IFA_F_NODAD if family == socket.AF_INET6 else 0
        body = _IFADDRMSG.pack(family, length or full, flags, scope, index)
        body += _attr(IFA_LOCAL, packed) + _attr(IFA_ADDRESS, packed)
        self.request(RTM_NEWADDR, NLM_F_CREATE | NLM_F_EXCL, body, ok=(errnos.EEXIST,))

    def route(
        self, index: int, to: str | None, via: str | None = None, exclusive: bool = False
    ) -> None:
        """`ip route replace <to>/32 dev <index>` (/128 for IPv6; `default via <via> dev
        <index>` with no `to`); `exclusive`: `ip route add`, raising `RouteTaken` if there is
        one already."""
        family, _ = _packed(to or via or "0.0.0.0")
        scope = RT_SCOPE_UNIVERSE if via else RT_SCOPE_LINK
        length = (32 if family == socket.AF_INET else 128) if to else 0
        body = _RTMSG.pack(family, length, 0, 0, RT_TABLE_MAIN, RTPROT_BOOT, scope, RTN_UNICAST, 0)
        if to:
            body += _attr(RTA_DST, _packed(to)[1])
        if via:
            body += _attr(RTA_GATEWAY, _packed(via)[1])
        body += _attr(RTA_OIF, struct.pack("=I", index))
        if not exclusive:
            self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_REPLACE, body)
            return
        try:
            self.request(RTM_NEWROUTE, NLM_F_CREATE | NLM_F_EXCL, body)
        except NetworkError as exc:
            if exc.errno == errnos.EEXIST:
                raise RouteTaken(str(exc)) from None
            raise

    def add_veth(self, name: str, peer: str, peer_netns_fd: int) -> None:
        """`ip link add <name> type veth peer name <peer> netns <fd>`."""
        peer_info = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        peer_info += _attr(IFLA_IFNAME, _name(peer))
        peer_info += _attr(IFLA_NET_NS_FD, struct.pack("=I", peer_netns_fd))
        info = _attr(IFLA_INFO_KIND, b"veth\0") + _attr(
            IFLA_INFO_DATA, _attr(VETH_INFO_PEER, peer_info)
        )
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0)
        body += _attr(IFLA_IFNAME, _name(name)) + _attr(IFLA_LINKINFO, info)
        self.request(RTM_NEWLINK, NLM_F_CREATE | NLM_F_EXCL, body)

    def delete_link(self, name: str) -> None:
        """`ip link del <name>`; gone already is fine."""
        body = _IFINFOMSG.pack(socket.AF_UNSPEC, 0, 0, 0, 0) + _attr(IFLA_IFNAME, _name(name))
        self.request(RTM_DELLINK, 0, body, ok=(errnos.ENODEV,))


# -- threads in a namespace ------------------------------------------------------------------


def _in_thread(fn: Callable[[], T]) -> T:
    """`fn` run by a thread of its own, which ends with it (and with any namespace it entered)."""
    result: list[T] = []
    failed: list[BaseException] = []

    def run() -> None:
        try:
            result.append(fn())
        except BaseException as e:  # handed to the calling thread
            failed.append(e)

    thread = threading.Thread(target=run, name="souk-netns", daemon=True)
    thread.start()
    thread.join()
    if failed:
        raise failed[0]
    return result[0]


def _enter(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc.setns(fd, CLONE_NEWNET) != 0:
            code = ctypes.get_errno()
            raise NetworkError(f"setns {path}: {os.strerror(code)}")
    finally:
        os.close(fd)


def _check(result: int, what: str) -> None:
    if result != 0:
        code = ctypes.get_errno()
        raise NetworkError(f"{what}: {os.strerror(code)}")


def _prepare_netns_dir() -> None:
    """What `ip netns add` does first: NETNS_DIR a shared mount, so that a namespace's name
    unmounted there is unmounted in every mount namespace (and the namespace freed)."""
    global _netns_dir_ready
    with _netns_dir_lock:
        if _netns_dir_ready:
            return
        NETNS_DIR.mkdir(mode=0o755, parents=True, exist_ok=True)
        target = os.fsencode(NETNS_DIR)
        if _libc.mount(b"", target, b"none", MS_SHARED | MS_REC, None) != 0:
            if ctypes.get_errno() != errnos.EINVAL:  # EINVAL: not a mount point yet
                _check(-1, f"mount --make-rshared {NETNS_DIR}")
            _check(_libc.mount(target, target, b"none", MS_BIND | MS_REC, None), "bind netns")
            _check(_libc.mount(b"", target, b"none", MS_SHARED | MS_REC, None), "share netns")
        _netns_dir_ready = True


# -- setup and teardown ----------------------------------------------------------------------


def resolver(address: str) -> str:
    """Where a machine at `address` (or any address or prefix of its cluster) asks names (`::3`
    of the cluster's /48, as Fly's fdaa::3): an address of the host's own loopback, which every
    machine routes to through its veth."""
    cluster = ipaddress.IPv6Network(f"{address.split('/')[0]}/48", strict=False)
    return str(cluster[3])


def resolv_conf(rundir: Path, address: str) -> Path:
    """The machine's /etc/resolv.conf, in its directory: its worker's DNS (docs/network.md).
    0644 whatever the umask: the machine reads it as its own user, and no one else writes it."""
    path = rundir / "resolv.conf"
    write_file(path, f"nameserver {resolver(address)}\n", mode=0o644)
    return path


def add_resolver(address: str) -> None:
    """The resolver's address on the host's loopback (`resolver`), before any machine is made:
    the worker's DNS answers there. There already is fine; it stays (every worker of the host
    and every machine uses it)."""
    with _Netlink() as nl:
        nl.add_address(socket.if_nametoindex("lo"), resolver(address))


def _egress() -> str:
    """An IPv4 address for a machine's traffic to the internet, drawn at random."""
    size = EGRESS.num_addresses
    return str(EGRESS[2 + int.from_bytes(os.urandom(4), "big") % (size - 3)])


def _make(path: Path, veth: str, address: str) -> None:
    """The namespace at `path` with its veth pair, routes and, last, the machine's address: all
    from one thread of its own, which moves between the namespaces (a thread's namespace is its
    own) and ends after. An IPv6 `address` gets an IPv4 one beside it (`_egress`)."""
    _prepare_netns_dir()
    os.close(os.open(path, os.O_RDONLY | os.O_CREAT | os.O_EXCL, 0))
    six = ipaddress.ip_address(address).version == 6
    if six:
        _check_forwarding()

    def make() -> None:
        host = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
        try:
            _check(_libc.unshare(CLONE_NEWNET), "unshare")
            own = b"/proc/thread-self/ns/net"
            _check(_libc.mount(own, os.fsencode(path), b"none", MS_BIND, None), f"bind {path}")
            netns = os.open(own, os.O_RDONLY | os.O_CLOEXEC)
            try:
                _check(_libc.setns(host, CLONE_NEWNET), "setns to the host's namespace")
                with _Netlink() as nl:
                    nl.add_veth(veth, "eth0", netns)
                    index = socket.if_nametoindex(veth)
                    nl.add_address(index, GATEWAY)  # answers the machine's ARP for its gateway
                    (_conf(veth) / "proxy_arp").write_text("1")
                    if six:
                        nl.add_address(index, GATEWAY6, 64)
                    nl.link_up(index)
                    if six:
                        nl.route(index, address)
                        ipv4 = _route_egress(nl, index)
                        cluster = ipaddress.IPv6Network(f"{address}/48", strict=False)
                        # its rules before it has an address to use
                        firewall.admit(veth, address, ipv4, cluster, resolver(address))
                        lo = socket.if_nametoindex("lo")
                        nl.add_address(lo, resolver(address))  # once a host: there is fine
                    else:
                        ipv4 = address
                        nl.route(index, address)
                _check(_libc.setns(netns, CLONE_NEWNET), f"setns {path}")
            finally:
                os.close(netns)
        finally:
            os.close(host)
        with _Netlink() as nl:
            eth0 = socket.if_nametoindex("eth0")
            nl.link_up(socket.if_nametoindex("lo"))
            nl.link_up(eth0)
            nl.route(eth0, GATEWAY)
            nl.route(eth0, None, via=GATEWAY)
            nl.add_address(eth0, ipv4)
            if six:
                nl.route(eth0, None, via=GATEWAY6)
                nl.add_address(eth0, address)  # last: what `setup` takes for complete

    _in_thread(make)


def _route_egress(nl: _Netlink, index: int) -> str:
    """The host's route to a free IPv4 address of `EGRESS`, to the veth at `index`."""
    for _ in range(64):
        ipv4 = _egress()
        try:
            nl.route(index, ipv4, exclusive=True)
        except RouteTaken:
            continue
        return ipv4
    raise NetworkError(f"no free address in {EGRESS} after 64 draws")


def _address_of(path: Path, six: bool) -> str | None:
    """The address on the namespace's eth0 (its IPv6 one if `six`), if it has one."""

    def inside() -> str | None:
        _enter(path)
        if six:
            for line in Path("/proc/thread-self/net/if_inet6").read_text().splitlines():
                fields = line.split()
                if fields[-1] == "eth0" and not fields[0].startswith("fe80"):
                    return str(ipaddress.IPv6Address(bytes.fromhex(fields[0])))
            return None
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
            try:
                found = fcntl.ioctl(sock, SIOCGIFADDR, struct.pack("256s", b"eth0"))
            except OSError:
                return None
        return socket.inet_ntoa(found[20:24])

    try:
        return _in_thread(inside)
    except (OSError, NetworkError):
        return None


def _check_forwarding() -> None:
    """Said once: without forwarding, machines reach their host and nothing beyond."""
    global _forwarding_checked
    if _forwarding_checked:
        return
    _forwarding_checked = True
    for knob in ("ipv4/ip_forward", "ipv6/conf/all/forwarding"):
        if Path(f"/proc/sys/net/{knob}").read_text().strip() != "1":
            log.warning(
                "net.%s is off: machines reach only this host (docs/network.md)",
                knob.replace("/", "."),
            )


def _unmake(netns: str, veth: str) -> None:
    with _Netlink() as nl:  # the pair at once, rather than with the namespace
        nl.delete_link(veth)
    firewall.forget(veth)
    path = NETNS_DIR / netns
    if _libc.umount2(os.fsencode(path), MNT_DETACH) != 0:  # what `ip netns del` does
        code = ctypes.get_errno()
        if code not in (errnos.EINVAL, errnos.ENOENT):  # not (or no longer) a mount
            raise NetworkError(f"umount {path}: {os.strerror(code)}")
    path.unlink(missing_ok=True)


def path_of(machine_id: str) -> Path:
    """Where the machine's namespace is named (`setup` makes it)."""
    return NETNS_DIR / names(machine_id)[0]


def egress(machine_id: str) -> str | None:
    """The IPv4 address the machine's namespace holds (drawn by `setup`, never stored): what a
    vm guest, which holds its machine's addresses itself, is told to take."""
    return _address_of(path_of(machine_id), False)


async def setup(machine_id: str, address: str) -> Path:
    """Create (or find complete) the machine's namespace; its path (`path_of`)."""
    veth = names(machine_id)[1]
    path = path_of(machine_id)
    six = ipaddress.ip_address(address).version == 6
    if path.exists() and _address_of(path, six) == str(ipaddress.ip_address(address)):
        if not six:
            return path
        ipv4 = _address_of(path, False)  # there before its IPv6 address, which is there
        if ipv4 is not None:  # its elements again (there already is fine): a table made anew
            cluster = ipaddress.IPv6Network(f"{address}/48", strict=False)  # has none
            await asyncio.to_thread(firewall.admit, veth, address, ipv4, cluster, resolver(address))
            return path
    await teardown(machine_id)
    await to_thread_to_its_end(_make, path, veth, address)
    return path


def remove(machine_id: str) -> None:
    """`teardown`, from a thread (or a process) with no event loop."""
    netns, veth = names(machine_id)
    if _conf(veth).exists() or os.path.lexists(NETNS_DIR / netns):
        _unmake(netns, veth)


async def teardown(machine_id: str) -> None:
    """Delete the namespace; its end of the veth pair, the host's end and the route go with it."""
    netns, veth = names(machine_id)
    if _conf(veth).exists() or os.path.lexists(NETNS_DIR / netns):
        await to_thread_to_its_end(_unmake, netns, veth)
