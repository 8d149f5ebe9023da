"""Mutual TLS 1.3 with Ed25519 certificates between real aiohttp servers and clients on loopback,
and certificates renewed on disk picked up by the next connection."""

from __future__ import annotations

import asyncio
import contextlib
import json
import ssl
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from typing import Any

import pytest
from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

from souk.pki import (
    NodeFiles,
    Reloader,
    client_context,
    load_cert,
    peer_identity,
    reloading_client_context,
    reloading_server_context,
    server_context,
)
from souk.pki.files import save_key
from souk.pki.issue import new_key
from tests.support.pki import LOOPBACK, Pki, serving


async def whoami(request: web.Request) -> web.Response:
    peer = peer_identity(request)
    conn = request.transport.get_extra_info("ssl_object") if request.transport else None
    der = conn.getpeercert(binary_form=True) if conn is not None else None
    serial = x509.load_der_x509_certificate(der).serial_number if der else None
    return web.json_response(
        {
            "peer": peer.uri if peer else None,
            "serial": serial,
            "version": conn.version() if conn is not None else None,
        }
    )


def whoami_app() -> web.Application:
    app = web.Application()
    app.router.add_get("/", whoami)
    return app


@dataclass
class Answer:
    body: dict[str, Any]
    server_serial: int
    server_key: object
    version: str | None


async def call(port: int, ctx: ssl.SSLContext, hostname: str = "w1") -> Answer:
    """GET / on a new connection, so every call is a new handshake; streams rather than aiohttp's
    client, which hands its connection back before the server's certificate can be looked at."""
    reader, writer = await asyncio.open_connection(
        LOOPBACK, port, ssl=ctx, server_hostname=hostname
    )
    try:
        conn = writer.get_extra_info("ssl_object")
        server = x509.load_der_x509_certificate(conn.getpeercert(binary_form=True))
        writer.write(b"GET / HTTP/1.1\r\nHost: souk\r\nConnection: close\r\n\r\n")
        raw = await reader.read()
    finally:
        writer.close()
        with contextlib.suppress(OSError, ssl.SSLError):
            await writer.wait_closed()
    if not raw:
        raise ConnectionError("the server closed the connection without answering")
    head, _, body = raw.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 200 "), raw
    return Answer(json.loads(body), server.serial_number, server.public_key(), conn.version())


async def refused(port: int, ctx: ssl.SSLContext, hostname: str = "w1") -> str:
    """The connection fails before any HTTP answer (in TLS 1.3 the client learns that its own
    certificate was turned away only when it reads, or sees the connection close); returns why."""
    with pytest.raises((ssl.SSLError, ConnectionError)) as caught:
        await call(port, ctx, hostname)
    return str(caught.value)


@pytest.fixture
async def worker_server(pki: Pki) -> AsyncIterator[tuple[int, NodeFiles]]:
    files = pki.node("worker", "w1")
    async with serving(whoami_app(), reloading_server_context(files, interval=0)) as port:
        yield port, files


def serial_of(files: NodeFiles) -> int:
    return load_cert(files.cert).serial_number


async def test_ed25519_mutual_tls_13(pki: Pki, worker_server: tuple[int, NodeFiles]):
    port, server_files = worker_server
    broker = pki.node("broker", "b1")
    answer = await call(port, client_context(broker))
    assert answer.version == "TLSv1.3"
    assert answer.body == {
        "peer": "souk://broker/b1",
        "serial": serial_of(broker),
        "version": "TLSv1.3",
    }
    assert answer.server_serial == serial_of(server_files)
    assert isinstance(answer.server_key, Ed25519PublicKey)


async def test_the_server_requires_a_client_certificate_of_its_ca(
    pki: Pki, other_pki: Pki, worker_server: tuple[int, NodeFiles]
):
    port, server_files = worker_server
    trusting = server_files.ca  # each client trusts the server; the server must refuse it
    no_cert = ssl.create_default_context(cafile=trusting)
    no_cert.minimum_version = ssl.TLSVersion.TLSv1_3
    stranger = client_context(replace(other_pki.node("broker", "b1"), ca=trusting))
    expired = client_context(pki.node("broker", "old", age_days=40))
    for client in (no_cert, stranger, expired):
        assert "certificate verify failed" not in await refused(port, client)  # not the client
    # The server still answers a good one after turning those away.
    assert (await call(port, client_context(pki.node("broker", "b1")))).body["peer"]


async def test_the_client_checks_the_name_of_the_server_it_meant(pki: Pki):
    """A broker reaching worker w1 passes server_hostname="w1": w2's certificate, however
    valid, is refused, as is a w1 certificate from another CA."""
    broker = client_context(pki.node("broker", "b1"))
    w2 = pki.node("worker", "w2")
    async with serving(whoami_app(), server_context(w2)) as port:
        assert (await call(port, broker, hostname="w2")).body["peer"] == "souk://broker/b1"
        assert "not valid for 'w1'" in await refused(port, broker, hostname="w1")


async def test_the_client_refuses_a_server_of_another_ca_or_expired(pki: Pki, other_pki: Pki):
    broker = client_context(pki.node("broker", "b1"))
    for server in (other_pki.node("worker", "w1"), pki.node("worker", "w1", age_days=40)):
        async with serving(whoami_app(), server_context(server, require_client_cert=False)) as port:
            assert "certificate verify failed" in await refused(port, broker)


async def test_a_renewed_server_certificate_serves_the_next_connection(
    pki: Pki, worker_server: tuple[int, NodeFiles]
):
    port, files = worker_server
    broker = client_context(pki.node("broker", "b1"))
    first = serial_of(files)
    assert (await call(port, broker)).server_serial == first

    pki.node("worker", "w1", reuse_key=True)  # renewed for the same key
    renewed = serial_of(files)
    assert renewed != first
    assert (await call(port, broker)).server_serial == renewed
    assert (await call(port, broker, hostname=LOOPBACK)).server_serial == renewed  # no SNI

    pki.node("worker", "w1")  # a new key and its certificate
    rekeyed = serial_of(files)
    answer = await call(port, broker)
    assert answer.server_serial == rekeyed
    assert answer.server_key == load_cert(files.cert).public_key()


async def test_a_half_done_rotation_keeps_the_last_good_certificate(
    pki: Pki, worker_server: tuple[int, NodeFiles]
):
    port, files = worker_server
    broker = client_context(pki.node("broker", "b1"))
    first = serial_of(files)
    save_key(files.key, new_key(), replace=True)  # the new key is there, its certificate not yet
    assert (await call(port, broker)).server_serial == first

    pki.node("worker", "w1", reuse_key=True)  # now its certificate is
    assert (await call(port, broker)).server_serial == serial_of(files) != first


async def test_a_renewed_client_certificate_is_shown_on_the_next_connection(
    pki: Pki, worker_server: tuple[int, NodeFiles]
):
    port, _ = worker_server
    files = pki.node("broker", "b1")
    tls = reloading_client_context(files, interval=0)
    assert (await call(port, tls.context())).body["serial"] == serial_of(files)
    pki.node("broker", "b1", reuse_key=True)
    assert (await call(port, tls.context())).body["serial"] == serial_of(files)


def test_files_are_looked_at_no_more_often_than_the_interval(pki: Pki):
    files = pki.node("broker", "b1")
    builds: list[int] = []

    def build() -> ssl.SSLContext:
        builds.append(serial_of(files))
        return client_context(files)

    slow = Reloader(build, (files.cert, files.key, files.ca), interval=3600)
    ctx = slow.context()
    pki.node("broker", "b1", reuse_key=True)
    assert slow.context() is ctx  # the hour has not passed
    assert len(builds) == 1

    eager = Reloader(build, (files.cert, files.key, files.ca), interval=0)
    ctx = eager.context()
    assert eager.context() is ctx  # nothing changed: nothing rebuilt
    pki.node("broker", "b1", reuse_key=True)
    assert eager.context() is not ctx
    assert builds[-1] == serial_of(files)
