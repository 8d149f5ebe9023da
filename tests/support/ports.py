"""Loopback ports for servers started by tests and benchmarks."""

from __future__ import annotations

import socket


def free_port() -> int:
    """A port free right now (the OS picked it); a server started soon after may bind it."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def closed_port() -> int:
    """A loopback port nothing listens on (connections are refused)."""
    return free_port()


def listening(port: int, host: str = "127.0.0.1") -> bool:
    with socket.socket() as s:
        return s.connect_ex((host, port)) == 0
