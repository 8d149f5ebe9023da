"""Which listening socket a connection reaches, as the kernel says over sock_diag, and whether a
process holds it: real sockets of this process on loopback addresses."""

from __future__ import annotations

import os
import socket
from collections.abc import Iterator

import pytest

from souk import listeners


@pytest.fixture
def opened() -> Iterator[list[socket.socket]]:
    made: list[socket.socket] = []
    yield made
    for sock in made:
        sock.close()


def listen(made: list[socket.socket], host: str, port: int = 0, v6: bool = False) -> int:
    """With SO_REUSEPORT, as a thief running as the machine's own uid could bind its port."""
    sock = socket.socket(socket.AF_INET6 if v6 else socket.AF_INET)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
    sock.bind((host, port))
    sock.listen()
    made.append(sock)
    return int(sock.getsockname()[1])


def inode_of(sock: socket.socket) -> int:
    return int(os.readlink(f"/proc/self/fd/{sock.fileno()}")[8:-1])


def test_the_socket_bound_to_the_address_is_the_one_reached(opened: list[socket.socket]) -> None:
    port = listen(opened, "127.77.0.1")
    (taker,) = listeners.takers("127.77.0.1", port)
    assert (str(taker.address), taker.port) == ("127.77.0.1", port)
    assert taker.inode == inode_of(opened[0]) and taker.uid == os.geteuid()
    assert listeners.takers("127.77.0.2", port) == []  # nothing listens at that address
    assert listeners.holds([os.getpid()], taker.inode)
    assert not listeners.holds([os.getpid()], taker.inode + 10**9)


def test_a_socket_bound_to_every_address_is_reached_only_if_none_is_bound_to_it(
    opened: list[socket.socket],
) -> None:
    port = listen(opened, "::", v6=True)  # dual stack: takes IPv4 connections too
    (anywhere,) = listeners.takers("127.77.0.3", port)
    assert anywhere.inode == inode_of(opened[0])
    listen(opened, "127.77.0.3", port)
    (exact,) = listeners.takers("127.77.0.3", port)
    assert exact.inode == inode_of(opened[1])
    listen(opened, "127.77.0.3", port)  # sharing the port: the kernel spreads connections
    assert {s.inode for s in listeners.takers("127.77.0.3", port)} == {
        inode_of(s) for s in opened[1:]
    }
    found = listeners.listening(port)
    assert {s.inode for s in found} == {inode_of(s) for s in opened}
    assert len({s.cookie for s in found}) == 3  # each socket its own
