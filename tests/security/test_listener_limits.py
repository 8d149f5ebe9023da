"""Every part's listener, run as its own process on loopback, against clients that hold
connections open without finishing anything: a cap on connections in all and per client
address, a deadline for the TLS handshake and each request head, a timeout for idle kept-alive
connections, and memory back where it was once a flood has gone. An ordinary client is served
throughout."""

from __future__ import annotations

import contextlib
import json
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from souk.web.limits import client_of
from tests.support.nats import NatsServer, needs_nats
from tests.support.parts import (
    PARTS,
    TLS_RECORD_START,
    Part,
    close_all,
    connect,
    count_hung_up,
    flood,
    hung_up,
    running_part,
)
from tests.support.pki import Pki, new_pki
from tests.support.waiting import wait_until

pytestmark = [pytest.mark.integration, needs_nats]

MAX_CONNECTIONS, PER_CLIENT = 150, 100
CAPPED = [
    "--max-connections",
    str(MAX_CONNECTIONS),
    "--max-connections-per-client",
    str(PER_CLIENT),
]
# Long enough that an idle connection admitted under the cap is still open when it is counted.
PATIENT = [*CAPPED, "--head-timeout", "60"]
HEAD_TIMEOUT, KEEPALIVE_TIMEOUT = 1.0, 3.0
IMPATIENT = [
    *CAPPED,
    *("--head-timeout", str(HEAD_TIMEOUT)),
    *("--keepalive-timeout", str(KEEPALIVE_TIMEOUT)),
]
HOSTILE, OTHER = "127.0.0.2", "127.0.0.3"  # two clients other than the ordinary one


@pytest.fixture(scope="module")
def pki(tmp_path_factory: pytest.TempPathFactory) -> Pki:
    return new_pki(tmp_path_factory.mktemp("listener-pki"))


@pytest.fixture(scope="module")
def nats() -> Iterator[str]:
    with NatsServer() as server:
        yield server.url


@pytest.fixture(params=PARTS)
def patient(request: pytest.FixtureRequest, tmp_path: Path, pki: Pki, nats: str) -> Iterator[Part]:
    with running_part(request.param, tmp_path, pki, nats, PATIENT) as part:
        yield part


@pytest.fixture(scope="module", params=PARTS)
def impatient(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory, pki: Pki, nats: str
) -> Iterator[Part]:
    work = tmp_path_factory.mktemp(f"impatient-{request.param}")
    with running_part(request.param, work, pki, nats, IMPATIENT) as part:
        yield part


def settled_hang_ups(socks: list[socket.socket], expected: int) -> int:
    """How many of `socks` the server has closed, once at least `expected` are (or 10 s)."""
    wait_until(lambda: count_hung_up(socks) >= expected, 10, f"{expected} connections closed")
    time.sleep(0.3)  # and no more after a moment
    return count_hung_up(socks)


def test_connections_are_capped_per_client_and_in_all_and_memory_comes_back(
    patient: Part,
) -> None:
    patient.request()
    before = patient.rss_mb()
    # A TLS part builds its handshake's state for a connection that has begun one; a plain
    # one, its HTTP parser for a request line begun.
    first = TLS_RECORD_START if patient.client_tls else b"GET / HTTP/1.1\r\n"
    hostile = flood(patient.port, 200, HOSTILE, first)
    other: list[socket.socket] = []
    try:
        assert settled_hang_ups(hostile, 200 - PER_CLIENT) == 200 - PER_CLIENT
        assert not any(hung_up(sock) for sock in hostile[:PER_CLIENT])  # the first ones stay

        other = flood(patient.port, 100, OTHER, first)
        room = MAX_CONNECTIONS - PER_CLIENT
        assert settled_hang_ups(other, 100 - room) == 100 - room
        with pytest.raises(OSError):  # all taken: even an ordinary client is turned away
            patient.request(timeout=5)
        during = patient.rss_mb()
        close_all(other)
        # the hostile client still holds all it may; anyone else is served again
        wait_until(lambda: _served(patient), 10, "an ordinary request served")
    finally:
        close_all([*hostile, *other])
    wait_until(lambda: patient.rss_mb() <= before * 1.2, 15, "memory back within 20%")
    assert patient.request() < 500
    print(f"{patient.kind}: RSS {before:.0f} MB, {during:.0f} MB flooded, then back")


def _served(part: Part) -> bool:
    try:
        return part.request(timeout=5) < 500
    except OSError:
        return False


def test_a_connection_that_sends_nothing_is_closed_after_the_head_timeout(
    impatient: Part,
) -> None:
    began = time.monotonic()
    [sock] = flood(impatient.port, 1, HOSTILE)
    try:
        wait_until(lambda: hung_up(sock), 10, "the silent connection closed")
        assert time.monotonic() - began >= HEAD_TIMEOUT * 0.9
    finally:
        sock.close()
    assert impatient.request() < 500


def test_a_handshake_begun_and_never_finished_is_closed_after_the_head_timeout(
    impatient: Part,
) -> None:
    if impatient.client_tls is None:
        pytest.skip(f"{impatient.kind} serves plain HTTP")
    began = time.monotonic()
    [sock] = flood(impatient.port, 1, HOSTILE, TLS_RECORD_START)
    try:
        wait_until(lambda: hung_up(sock), 10, "the half-begun handshake closed")
        assert time.monotonic() - began >= HEAD_TIMEOUT * 0.9
    finally:
        sock.close()


def _opened(part: Part) -> socket.socket:
    """A connection ready for HTTP: its TLS handshake done when the part serves TLS."""
    if part.client_tls is not None:
        return part.tls_socket(HOSTILE)
    sock = connect(part.port, HOSTILE)
    sock.settimeout(10)
    return sock


def _answered(sock: socket.socket) -> bytes:
    """One whole response (its head and Content-Length bytes of body)."""
    got = b""
    while b"\r\n\r\n" not in got:
        chunk = sock.recv(65536)
        assert chunk, got
        got += chunk
    head, _, body = got.partition(b"\r\n\r\n")
    length = next(
        int(line.split(b":", 1)[1])
        for line in head.split(b"\r\n")
        if line.lower().startswith(b"content-length:")
    )
    while len(body) < length:
        chunk = sock.recv(65536)
        assert chunk, got
        body += chunk
    return head


def _trickle_until_closed(sock: socket.socket, head: bytes) -> tuple[float, bytes]:
    """`head` one header line every 0.2 s (never its end), until the server answers or hangs
    up; how long it took, and what came back."""
    began = time.monotonic()
    sock.sendall(head)
    sock.settimeout(0.2)
    got = b""
    for n in range(100):
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            try:
                sock.sendall(f"X-Slow-{n}: a\r\n".encode())
            except OSError:
                break
            continue
        except OSError:
            break
        if not chunk:
            break
        got += chunk
    return time.monotonic() - began, got


def _timed_out(got: bytes) -> None:
    head, _, body = got.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 408"), got
    assert json.loads(body)["code"] == "timeout"


def test_a_slowloris_head_is_cut_with_a_408(impatient: Part) -> None:
    sock = _opened(impatient)
    try:
        took, got = _trickle_until_closed(sock, f"GET {impatient.probe} HTTP/1.1\r\n".encode())
    finally:
        sock.close()
    _timed_out(got)
    assert HEAD_TIMEOUT * 0.9 <= took < 10
    assert impatient.request() < 500


def test_a_slow_head_on_a_kept_alive_connection_is_cut_too(impatient: Part) -> None:
    sock = _opened(impatient)
    try:
        sock.sendall(f"GET {impatient.probe} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert _answered(sock).startswith(b"HTTP/1.1 ")
        took, got = _trickle_until_closed(sock, b"GET / HTTP/1.1\r\n")
    finally:
        sock.close()
    _timed_out(got)
    assert took >= HEAD_TIMEOUT * 0.9


def test_an_idle_kept_alive_connection_is_closed(impatient: Part) -> None:
    sock = _opened(impatient)
    try:
        sock.sendall(f"GET {impatient.probe} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
        assert _answered(sock).startswith(b"HTTP/1.1 ")
        answered = time.monotonic()
        sock.settimeout(KEEPALIVE_TIMEOUT + 10)
        with contextlib.suppress(ConnectionError):
            assert sock.recv(65536) == b""
        assert time.monotonic() - answered >= KEEPALIVE_TIMEOUT * 0.9
    finally:
        sock.close()


@pytest.mark.parametrize(
    ("peer", "client"),
    [
        (("203.0.113.7", 5000), "203.0.113.7"),
        (("::ffff:203.0.113.7", 5000, 0, 0), "203.0.113.7"),
        (("2001:db8:1:2:aaaa::1", 5000, 0, 0), "2001:db8:1:2::/64"),
        (("2001:db8:1:2:bbbb::9", 5000, 0, 0), "2001:db8:1:2::/64"),
    ],
)
def test_an_ipv6_client_is_counted_by_its_64(peer: tuple[object, ...], client: str) -> None:
    assert client_of(peer) == client
