"""qemu's monitor (QMP) on its unix socket, for what only the monitor does: pause and continue a
guest (suspend and resume; its memory is saved by `vm_memory.py`).

Each call is a short connection of its own, run in a thread: qemu takes one monitor client at a
time, and a worker restarted after a crash finds the socket again by its path in the machine's
directory."""

from __future__ import annotations

import json
import socket
from pathlib import Path
from typing import Any

from souk.worker.drivers.vm_channel import short_socket
from souk.worker.threads import to_thread_to_its_end

TIMEOUT = 60.0


class QmpError(RuntimeError):
    pass


class _Monitor:
    def __init__(self, path: Path) -> None:
        self.sock = short_socket(path.parent, path.name)
        self.sock.settimeout(TIMEOUT)
        self.file = self.sock.makefile("rb")
        self._reply()  # the greeting
        self.call("qmp_capabilities")

    def _reply(self) -> dict[str, Any]:
        while True:
            line = self.file.readline()
            if not line:
                raise QmpError("qemu closed its monitor")
            message = json.loads(line)
            if "event" not in message:
                return dict(message)

    def call(self, command: str, fds: list[int] | None = None, **arguments: Any) -> Any:
        request = json.dumps({"execute": command, "arguments": arguments}).encode()
        if fds:
            socket.send_fds(self.sock, [request], fds)
        else:
            self.sock.sendall(request)
        reply = self._reply()
        if "error" in reply:
            raise QmpError(f"{command}: {reply['error'].get('desc', reply['error'])}")
        return reply.get("return")

    def close(self) -> None:
        self.file.close()
        self.sock.close()


def _with_monitor(path: Path, *commands: str) -> None:
    monitor = _Monitor(path)
    try:
        for command in commands:
            monitor.call(command)
    finally:
        monitor.close()


def _status(path: Path) -> str:
    monitor = _Monitor(path)
    try:
        return str(monitor.call("query-status").get("status", ""))
    finally:
        monitor.close()


async def pause(path: Path) -> None:
    await to_thread_to_its_end(_with_monitor, path, "stop")


async def cont(path: Path) -> None:
    await to_thread_to_its_end(_with_monitor, path, "cont")


async def status(path: Path) -> str:
    return await to_thread_to_its_end(_status, path)
