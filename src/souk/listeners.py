"""Who listens where: the listening TCP sockets of this network namespace, asked of the kernel,
and whether some processes hold a given socket.

The proxy asks which socket a connection to a machine's address reaches before it sends that
connection a request, and the machine's worker says whether the machine's processes hold that
socket (see docs/proxy.md). The listeners come from sock_diag over netlink, with a dump of
listening sockets only: the kernel walks its table of listeners, not every connection of the
host, so the answer costs tens of microseconds where /proc/net/tcp costs milliseconds on a busy
host (it prints every socket).
"""

from __future__ import annotations

import ipaddress
import os
import socket
import struct
from dataclasses import dataclass
from pathlib import Path

NETLINK_SOCK_DIAG = 4  # linux/netlink.h (NETLINK_INET_DIAG)
SOCK_DIAG_BY_FAMILY = 20  # linux/sock_diag.h
NLM_F_REQUEST = 0x1
NLM_F_DUMP = 0x300
NLMSG_ERROR = 2
NLMSG_DONE = 3
TCP_LISTEN = 10
_HEADER = struct.Struct("=IHHII")  # nlmsghdr: length, type, flags, seq, pid
_REQUEST = struct.Struct("=BBBBI48x")  # inet_diag_req_v2: family, protocol, ext, pad, states, id
_MESSAGE = struct.Struct("=BBBB")  # inet_diag_msg: family, state, timer, retrans
_PORTS = struct.Struct(">HH")  # its id's ports, in network order, then src[16], dst[16]
_TAIL = struct.Struct("=I8sIIIII")  # if, cookie, expires, rqueue, wqueue, uid, inode
_MESSAGE_SIZE = 72
PROC = Path("/proc")

Address = ipaddress.IPv4Address | ipaddress.IPv6Address


@dataclass(frozen=True)
class Listener:
    """A listening socket: where it is bound, its owner's uid, its inode (what a process's fd
    names it by), and its cookie (never given to another socket while the host runs)."""

    address: Address
    port: int
    uid: int
    inode: int
    cookie: bytes


def listening(port: int | None = None) -> list[Listener]:
    """Every listening TCP socket of this network namespace (on `port`, if given)."""
    found: list[Listener] = []
    with socket.socket(socket.AF_NETLINK, socket.SOCK_DGRAM, NETLINK_SOCK_DIAG) as sock:
        sock.settimeout(5)
        for seq, family in enumerate((socket.AF_INET, socket.AF_INET6), 1):
            body = _REQUEST.pack(family, socket.IPPROTO_TCP, 0, 0, 1 << TCP_LISTEN)
            head = _HEADER.pack(
                _HEADER.size + len(body), SOCK_DIAG_BY_FAMILY, NLM_F_REQUEST | NLM_F_DUMP, seq, 0
            )
            sock.send(head + body)
            found.extend(_answers(sock, seq, port))
    return found


def _answers(sock: socket.socket, seq: int, port: int | None) -> list[Listener]:
    found: list[Listener] = []
    while True:
        data = sock.recv(1 << 16)
        offset = 0
        while offset + _HEADER.size <= len(data):
            length, kind, _, answered, _ = _HEADER.unpack_from(data, offset)
            if length < _HEADER.size:
                raise OSError("sock_diag: a malformed answer")
            body = offset + _HEADER.size
            offset += (length + 3) & ~3
            if answered != seq:
                continue
            if kind == NLMSG_DONE:
                return found
            if kind == NLMSG_ERROR:
                (code,) = struct.unpack_from("=i", data, body)
                raise OSError(-code, f"sock_diag: {os.strerror(-code)}")
            if length - _HEADER.size >= _MESSAGE_SIZE:
                listener = _listener(data, body)
                if port is None or listener.port == port:
                    found.append(listener)


def _listener(data: bytes, at: int) -> Listener:
    family = _MESSAGE.unpack_from(data, at)[0]
    sport, _ = _PORTS.unpack_from(data, at + 4)
    raw = data[at + 8 : at + 24]
    address: Address = (
        ipaddress.IPv4Address(raw[:4]) if family == socket.AF_INET else ipaddress.IPv6Address(raw)
    )
    _, cookie, _, _, _, uid, inode = _TAIL.unpack_from(data, at + 40)
    return Listener(address, sport, uid, inode, cookie)


def takers(host: str, port: int) -> list[Listener]:
    """The listening sockets a connection to host:port reaches in this namespace: those bound to
    that very address if there are any (the kernel looks them up first; several only if they
    share the port with SO_REUSEPORT), else those bound to every address (a dual-stack `::`
    socket takes IPv4 connections too)."""
    target = ipaddress.ip_address(host)
    same = {target}
    if isinstance(target, ipaddress.IPv4Address):
        same.add(ipaddress.IPv6Address(f"::ffff:{target}"))
        anywhere: set[Address] = {ipaddress.IPv4Address(0), ipaddress.IPv6Address(0)}
    else:
        anywhere = {ipaddress.IPv6Address(0)}
    found = listening(port)
    exact = [s for s in found if s.address in same]
    return exact or [s for s in found if s.address in anywhere]


def holds(pids: list[int], inode: int) -> bool:
    """Whether one of these processes has the socket `inode` among its open files."""
    wanted = f"socket:[{inode}]"
    for pid in pids:
        fds = PROC / str(pid) / "fd"
        try:
            entries = os.listdir(fds)
        except OSError:  # gone, or not ours to read
            continue
        for fd in entries:
            try:
                if os.readlink(fds / fd) == wanted:
                    return True
            except OSError:
                continue
    return False
