"""The worker's end of a guest's channel: the virtio-serial port `souk.0`, a unix socket on the
host (qemu's), framed as the guest init (`init/channel.c`) reads it.

A frame: a 32-bit length of what follows, a type byte, a 32-bit request id, then fields, each a
32-bit length and its bytes (big-endian). One reader task per connection hands each answer to
the request waiting for its id; `exit` and `started`/`failed` reports are kept for whoever asks.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import socket
import struct
from collections.abc import Iterable
from pathlib import Path
from typing import Any

_LEN = struct.Struct(">I")
_HEAD = struct.Struct(">cI")


class ChannelClosed(ConnectionError):
    """The guest's channel is gone: qemu exited, or never opened its socket."""


def frame(kind: bytes, request: int, fields: Iterable[bytes]) -> bytes:
    body = b"".join(_LEN.pack(len(f)) + f for f in fields)
    head = _HEAD.pack(kind, request)
    return _LEN.pack(len(head) + len(body)) + head + body


def parse(data: bytes) -> tuple[bytes, int, list[bytes]]:
    """A frame's body (without its length): its type, id and fields."""
    kind, request = _HEAD.unpack_from(data)
    fields, at = [], _HEAD.size
    while at + 4 <= len(data):
        (size,) = _LEN.unpack_from(data, at)
        fields.append(data[at + 4 : at + 4 + size])
        at += 4 + size
    return kind, request, fields


class Channel:
    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self._reader, self._writer = reader, writer
        self._ids = itertools.count(1)
        self._waiting: dict[int, asyncio.Future[list[bytes]]] = {}
        self.hello: asyncio.Future[None] = asyncio.get_running_loop().create_future()
        self.ready: asyncio.Future[str | None] = asyncio.get_running_loop().create_future()
        self.exit_code: asyncio.Future[int] = asyncio.get_running_loop().create_future()
        self._task = asyncio.ensure_future(self._read())

    @classmethod
    async def connect_in(cls, rundir: Path, name: str, timeout: float = 10.0) -> Channel:
        """Connect to qemu's socket `rundir/name`, waiting for qemu to make it."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        while True:
            try:
                sock = short_socket(rundir, name)
                break
            except (FileNotFoundError, ConnectionRefusedError) as exc:
                if loop.time() > deadline:
                    raise ChannelClosed(f"no guest channel at {name}") from exc
                await asyncio.sleep(0.01)
        reader, writer = await asyncio.open_unix_connection(sock=sock, limit=1 << 24)
        return cls(reader, writer)

    @property
    def closed(self) -> bool:
        return self._task.done()

    async def _read(self) -> None:
        try:
            while True:
                (size,) = _LEN.unpack(await self._reader.readexactly(4))
                kind, request, fields = parse(await self._reader.readexactly(size))
                self._dispatch(kind, request, fields)
        except (asyncio.IncompleteReadError, ConnectionError, struct.error):
            pass
        finally:
            gone = ChannelClosed("the guest's channel closed")
            pending: list[asyncio.Future[Any]] = [*self._waiting.values(), self.hello, self.ready]
            for future in pending:
                if not future.done():
                    future.set_exception(gone)
                    future.exception()  # retrieved: nobody may be waiting
            self._waiting.clear()

    def _dispatch(self, kind: bytes, request: int, fields: list[bytes]) -> None:
        if kind == b"H" and not self.hello.done():
            self.hello.set_result(None)
        elif kind == b"R" and not self.ready.done():
            self.ready.set_result(None)
        elif kind == b"F" and not self.ready.done():
            self.ready.set_result(fields[0].decode(errors="replace") if fields else "failed")
        elif kind == b"X" and not self.exit_code.done() and fields:
            self.exit_code.set_result(int(fields[0]))
        elif (waiting := self._waiting.pop(request, None)) is not None and not waiting.done():
            waiting.set_result(fields)

    async def send(self, kind: bytes, fields: Iterable[bytes], request: int = 0) -> None:
        self._writer.write(frame(kind, request, fields))
        await self._writer.drain()

    async def ask(
        self, kind: bytes, fields: Iterable[bytes]
    ) -> tuple[int, asyncio.Future[list[bytes]]]:
        """Send a request; its id and the future of its answer."""
        request = next(self._ids)
        answer: asyncio.Future[list[bytes]] = asyncio.get_running_loop().create_future()
        self._waiting[request] = answer
        await self.send(kind, fields, request)
        return request, answer

    async def close(self) -> None:
        self._task.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._task
        self._writer.close()
        with contextlib.suppress(ConnectionError):
            await self._writer.wait_closed()


def short_socket(rundir: Path, name: str) -> socket.socket:
    """A unix socket connected to `rundir/name` by a path short enough for any `rundir` (a
    socket's path holds 107 bytes): through the directory's descriptor."""
    fd = os.open(rundir, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    try:
        sock.connect(f"/proc/self/fd/{fd}/{name}")
    except OSError:
        sock.close()
        raise
    finally:
        os.close(fd)
    return sock
