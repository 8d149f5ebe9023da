"""Each part that listens, run as its own process on loopback (a worker serving mutual TLS, a
broker and a proxy serving HTTPS, `souk catalog serve` plain HTTP), and the raw connections a
hostile client opens to it: for the listener's limits, in tests and in bench/flood.py."""

from __future__ import annotations

import contextlib
import select
import socket
import ssl
import subprocess
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from souk.node.cluster_secret import new_secret
from souk.pki import client_context
from tests.support.pki import Pki
from tests.support.ports import free_port
from tests.support.worker_process import SOUK

PARTS = ("worker", "broker", "proxy", "catalog")
READY_TIMEOUT = 30.0
TLS_RECORD_START = b"\x16"  # the first byte of a ClientHello: a handshake begun, never finished


@dataclass
class Part:
    """One running part: where it listens, how a well-behaved client reaches it."""

    kind: str
    proc: subprocess.Popen[bytes]
    port: int
    client_tls: ssl.SSLContext | None  # None: plain HTTP
    probe: str  # a path it answers without a token
    log: Path

    @property
    def url(self) -> str:
        return f"{'https' if self.client_tls else 'http'}://127.0.0.1:{self.port}"

    def rss_mb(self) -> float:
        """Its resident memory now, from /proc/PID/status."""
        with open(f"/proc/{self.proc.pid}/status") as status:
            for line in status:
                if line.startswith("VmRSS:"):
                    return int(line.split()[1]) / 1024
        raise RuntimeError(f"{self.kind} has exited: {self.log.read_text()[-2000:]}")

    def request(self, timeout: float = 10.0) -> int:
        """One ordinary request from 127.0.0.1: its HTTP status (an error status counts: the
        part answered); transport errors raise."""
        req = urllib.request.Request(self.url + self.probe)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.client_tls) as resp:
                resp.read()
                return int(resp.status)
        except urllib.error.HTTPError as exc:
            return int(exc.code)

    def tls_socket(self, source: str = "127.0.0.1") -> socket.socket:
        """A connection with its handshake done (the worker's with a client certificate)."""
        assert self.client_tls is not None
        raw = connect(self.port, source)
        raw.settimeout(10)
        return self.client_tls.wrap_socket(raw, server_hostname="127.0.0.1")

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def _argv(kind: str, port: int, work: Path, pki: Pki, nats: str) -> tuple[list[str], str]:
    """The command line of `kind` listening on `port`, and a path it answers without a token."""
    listen = f"127.0.0.1:{port}"
    if kind == "worker":
        files = pki.node("worker", "w1")
        argv = [
            *("worker", "--name", "w1", "--region", "mad", "--listen", listen),
            *("--data-dir", str(work / "w1"), "--cpus", "2", "--memory-mb", "1024"),
            *("--driver", "sim", "--tls-dir", str(files.cert.parent)),
        ]
        return argv, "/v1/capacity"
    if kind == "broker":
        secret = work / "secret"
        secret.write_bytes(new_secret() + b"\n")
        secret.chmod(0o600)
        files = pki.node("broker", "b1")
        argv = [
            *("broker", "--listen", listen, "--secret-file", str(secret)),
            *("--worker", f"http://127.0.0.1:{free_port()}"),
            *("--tls-cert", str(files.cert), "--tls-key", str(files.key)),
        ]
        return argv, "/openapi.json"
    if kind == "proxy":
        files = pki.node("proxy", "p1")
        argv = [
            *("proxy", "--listen", listen, "--nats", nats, "--token", "unused"),
            *("--api", f"http://127.0.0.1:{free_port()}"),
            *("--tls-cert", str(files.cert), "--tls-key", str(files.key)),
        ]
        return argv, "/.souk/health"
    if kind == "catalog":
        return ["catalog", "serve", "--nats", nats, "--listen", listen, "--insecure"], "/metrics"
    raise ValueError(kind)


def start_part(kind: str, work: Path, pki: Pki, nats: str, flags: Sequence[str] = ()) -> Part:
    """`kind` started with its listener `flags`, once it answers an ordinary request."""
    work.mkdir(parents=True, exist_ok=True)
    port = free_port()
    argv, probe = _argv(kind, port, work, pki, nats)
    log = work / f"{kind}.log"
    with open(log, "ab") as out:
        proc = subprocess.Popen(
            [str(SOUK), *argv, *flags, "--log-level", "warning"],
            stdin=subprocess.DEVNULL,
            stdout=out,
            stderr=out,
        )
    tls: ssl.SSLContext | None = None
    if kind == "worker":
        tls = client_context(pki.node("operator", "ops"))
    elif kind in ("broker", "proxy"):
        tls = ssl.create_default_context(cafile=pki.ca_dir / "ca.crt")
    part = Part(kind, proc, port, tls, probe, log)
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        if proc.poll() is not None:
            raise RuntimeError(f"{kind} exited: {log.read_text()[-2000:]}")
        try:
            part.request(timeout=2)
            return part
        except OSError:
            if time.monotonic() > deadline:
                part.stop()
                raise RuntimeError(f"{kind} not ready: {log.read_text()[-2000:]}") from None
            time.sleep(0.05)


@contextlib.contextmanager
def running_part(
    kind: str, work: Path, pki: Pki, nats: str, flags: Sequence[str] = ()
) -> Iterator[Part]:
    part = start_part(kind, work, pki, nats, flags)
    try:
        yield part
    finally:
        part.stop()


def connect(port: int, source: str = "127.0.0.1") -> socket.socket:
    """A TCP connection to 127.0.0.1:`port` from `source` (any 127.x address is this host's:
    a client of another address, as far as the server can tell)."""
    sock = socket.socket()
    sock.bind((source, 0))
    sock.connect(("127.0.0.1", port))
    return sock


def flood(port: int, count: int, source: str, first: bytes = b"") -> list[socket.socket]:
    """`count` connections from `source`, each sending `first` (nothing: bare TCP)."""
    made: list[socket.socket] = []
    try:
        for _ in range(count):
            sock = connect(port, source)
            if first:
                sock.sendall(first)
            made.append(sock)
    except BaseException:
        close_all(made)
        raise
    return made


def close_all(socks: Sequence[socket.socket]) -> None:
    for sock in socks:
        sock.close()


def hung_up(sock: socket.socket) -> bool:
    """Whether the server has closed this connection (read without blocking: EOF or reset)."""
    poller = select.poll()  # not select(): a flood's descriptors go past 1024
    poller.register(sock, select.POLLIN)
    if not poller.poll(0):
        return False
    try:
        return sock.recv(65536, socket.MSG_PEEK) == b""
    except ConnectionError:
        return True


def count_hung_up(socks: Sequence[socket.socket]) -> int:
    return sum(hung_up(sock) for sock in socks)
