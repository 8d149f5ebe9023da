"""A real `nats-server` on loopback, for the catalog over NATS in tests and benchmarks."""

from __future__ import annotations

import shutil
import ssl
import subprocess
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType

import nats
import pytest
from nats.aio.client import Client

from tests.support.ports import free_port, listening
from tests.support.waiting import wait_until

# Debian installs it in /usr/sbin, which is not on every user's PATH.
NATS = shutil.which("nats-server") or shutil.which("nats-server", path="/usr/sbin:/usr/local/sbin")
needs_nats = pytest.mark.skipif(NATS is None, reason="nats-server is not installed")


async def can_connect(url: str, tls: ssl.SSLContext | None) -> bool:
    """Whether a client with `tls` (None: none) is let onto the server at `url`."""

    async def quiet(_: Exception) -> None:
        pass

    try:
        nc = await nats.connect(
            url, tls=tls, allow_reconnect=False, connect_timeout=2, error_cb=quiet
        )
    except Exception:
        return False
    await nc.close()
    return True


async def flushed(nc: Client) -> None:
    """Everything `nc` sent so far, SUBs included, is at the server. nats-py's `flush` writes
    its PING straight to the socket, ahead of commands still queued for its flusher task, so
    its PONG can come back before a SUB or PUB made just before has left: the queue is written
    out first (a private call; nats-py offers no public one), then the round trip."""
    await nc._flush_pending(force_flush=True)
    await nc.flush()


@dataclass
class NatsServer:
    """One `nats-server`; with `monitor_port`, its HTTP monitoring endpoint too."""

    port: int = field(default_factory=free_port)
    monitor_port: int | None = None
    log_path: Path | None = None
    proc: subprocess.Popen[bytes] | None = None
    config: Path | None = None  # a configuration file (with this port), else plain on loopback

    @property
    def url(self) -> str:
        return f"nats://127.0.0.1:{self.port}"

    @property
    def monitor(self) -> str:
        assert self.monitor_port is not None, "started without a monitoring port"
        return f"http://127.0.0.1:{self.monitor_port}"

    @property
    def pid(self) -> int:
        assert self.proc is not None, "not started"
        return self.proc.pid

    def start(self) -> None:
        if NATS is None:
            raise RuntimeError("nats-server is not installed (Debian: apt-get install nats-server)")
        argv = [NATS, "-a", "127.0.0.1", "-p", str(self.port)]
        if self.config is not None:
            argv = [NATS, "-c", str(self.config)]
        if self.monitor_port is not None:
            argv += ["-m", str(self.monitor_port)]
        if self.log_path is None:
            self.proc = subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        else:
            with open(self.log_path, "ab") as log:
                self.proc = subprocess.Popen(argv, stdin=subprocess.DEVNULL, stdout=log, stderr=log)
        wait_until(self._ready, 10, "nats-server listening")

    def _ready(self) -> bool:
        assert self.proc is not None
        if self.proc.poll() is not None:
            raise RuntimeError(f"nats-server exited with {self.proc.returncode}")
        ports = [self.port] if self.monitor_port is None else [self.port, self.monitor_port]
        return all(listening(p) for p in ports)

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def __enter__(self) -> NatsServer:
        self.start()
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()


def nats_version() -> str:
    """The installed server's version ("?" when it is missing)."""
    if NATS is None:
        return "?"
    out = subprocess.run([NATS, "--version"], capture_output=True, text=True, check=False)
    return out.stdout.strip().removeprefix("nats-server: ")
