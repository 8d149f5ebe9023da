"""The proxy's probe of a just-started machine's port: a connect that is refused a hundred
times while an app binds must leave nothing for the garbage collector."""

from __future__ import annotations

import asyncio
import gc
import socket
import time

import pytest

from souk.proxy.wake import accepts, port_open


def closed_port(family: socket.AddressFamily = socket.AF_INET, host: str = "127.0.0.1") -> int:
    """A port nothing listens on (bound, then released)."""
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


@pytest.mark.parametrize(
    ("family", "host"), [(socket.AF_INET, "127.0.0.1"), (socket.AF_INET6, "::1")]
)
async def test_a_listening_port_accepts_and_a_closed_one_refuses(
    family: socket.AddressFamily, host: str
) -> None:
    with socket.socket(family, socket.SOCK_STREAM) as listener:
        try:
            listener.bind((host, 0))
        except OSError:
            pytest.skip(f"no {host} on this host")
        listener.listen()
        assert await accepts(host, listener.getsockname()[1], 1.0)
    assert not await accepts(host, closed_port(family, host), 1.0)


async def test_refused_connects_make_no_garbage_cycles() -> None:
    port = closed_port()
    gc.collect()
    gc.disable()
    try:
        for _ in range(100):
            assert not await accepts("127.0.0.1", port, 1.0)
        # asyncio's streams left about 80 objects in cycles per refusal
        assert gc.collect() < 50
    finally:
        gc.enable()


async def test_port_open_waits_for_the_app_to_bind() -> None:
    port = closed_port()
    listener = socket.socket(socket.AF_INET, socket.SOCK_STREAM)

    async def bind_later() -> None:
        await asyncio.sleep(0.05)
        listener.bind(("127.0.0.1", port))
        listener.listen()

    with listener:
        binding = asyncio.create_task(bind_later())
        assert await port_open("127.0.0.1", port, time.monotonic() + 5)
        await binding
    assert not await port_open("127.0.0.1", port, time.monotonic() + 0.05)
