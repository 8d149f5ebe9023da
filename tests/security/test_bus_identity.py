"""A part's identity on the catalog: its node files sign its rows and show its certificate to the
bus, following a renewal without a restart; without them, the open bus is for loopback only
unless `--insecure` says otherwise."""

from __future__ import annotations

import asyncio
import ssl
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.hazmat.primitives.serialization import Encoding

from souk.catalog.node import NodeKey, renewing
from souk.pki import NodeFiles, client_context, load_cert, server_context
from tests.security.test_cli_tls import SECRET, invoke, said, worker
from tests.support.pki import LOOPBACK, Pki
from tests.support.ports import free_port
from tests.support.waiting import eventually

OPEN_BUS = "nats://10.0.0.2:4222"


class Clock:
    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


def der(files: NodeFiles) -> bytes:
    return load_cert(files.cert).public_bytes(Encoding.DER)


def verify(files: NodeFiles, signature: bytes, data: bytes) -> None:
    """Raises unless the key of the certificate in `files` made `signature` over `data`."""
    public = load_cert(files.cert).public_key()
    assert isinstance(public, Ed25519PublicKey)
    public.verify(signature, data)


def signed_by(files: NodeFiles, key: NodeKey) -> bool:
    """Whether `key` signs with the key of the certificate now in `files`, and says so."""
    fp = key.fingerprint  # as an owner does: the fingerprint first, then the signature
    signature = key.sign(b"rows")
    verify(files, signature, b"rows")
    return key.certificate == der(files) and fp == NodeKey(files).fingerprint


def test_a_node_key_signs_with_the_certificate_now_on_disk(pki: Pki) -> None:
    files = pki.node("worker", "w1")
    clock = Clock()
    key = NodeKey(files, interval=2.0, clock=clock)
    assert signed_by(files, key)
    first = key.certificate

    pki.node("worker", "w1", reuse_key=True)  # renewed: the same key, a new certificate
    key.fingerprint  # noqa: B018 (looks at the files, but not before its interval)
    assert key.certificate == first
    clock.now = 2.5
    assert signed_by(files, key) and key.certificate != first

    pki.node("worker", "w1")  # a new key and its certificate
    clock.now = 5.0
    assert signed_by(files, key)


def test_files_caught_mid_change_leave_the_last_good_pair(pki: Pki) -> None:
    files = pki.node("worker", "w1")
    clock = Clock()
    key = NodeKey(files, interval=2.0, clock=clock)
    before = key.fingerprint
    files.key.write_bytes(pki.node("worker", "w2").key.read_bytes())  # the key, not its cert yet
    clock.now = 3.0
    assert key.fingerprint == before
    verify(files, key.sign(b"x"), b"x")


async def test_a_followed_connection_shows_the_renewed_certificate(pki: Pki) -> None:
    """As a bus connection does when it reconnects: the certificate its TLS context holds."""
    seen: list[bytes] = []

    async def record(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        seen.append(writer.get_extra_info("ssl_object").getpeercert(binary_form=True))
        writer.write(b"ok")
        await writer.drain()
        writer.close()

    server = await asyncio.start_server(
        record, LOOPBACK, 0, ssl=server_context(pki.node("bus", "nats-1"))
    )
    port = server.sockets[0].getsockname()[1]
    files = pki.node("worker", "w1")
    clock = Clock()
    key = NodeKey(files, interval=2.0, clock=clock)
    context = client_context(files)
    key.follow(context)

    async def connect(ctx: ssl.SSLContext) -> None:
        reader, writer = await asyncio.open_connection(
            LOOPBACK, port, ssl=ctx, server_hostname="nats-1"
        )
        assert await reader.read() == b"ok"
        writer.close()

    async with server:
        await connect(context)
        first = der(files)
        pki.node("worker", "w1", reuse_key=True)
        clock.now = 3.0
        key.refresh()
        await connect(context)
    assert seen == [first, der(files)] and first != der(files)


async def test_a_key_that_signs_nothing_is_still_renewed(pki: Pki) -> None:
    """A broker without the registry, or a proxy, signs nothing: a timer looks at its files, so
    that its bus connection's next reconnect shows the renewed certificate."""
    files = pki.node("proxy", "p1")
    key = NodeKey(files, interval=0.05)
    async with renewing(key):
        pki.node("proxy", "p1", reuse_key=True)
        await eventually(lambda: key.certificate == der(files), timeout=10)


def test_a_worker_without_node_files_uses_an_open_bus_only_on_loopback(tmp_path: Path) -> None:
    listen = ("--listen", f"127.0.0.1:{free_port()}")
    refused = worker(tmp_path, *listen, "--nats", f"nats://127.0.0.1:4222,{OPEN_BUS}")
    assert refused.exit_code == 2
    assert OPEN_BUS in said(refused) and "--insecure" in said(refused)
    assert not (tmp_path / "w1").exists()  # nothing started


def test_brokers_and_proxies_too(tmp_path: Path, pki: Pki) -> None:
    (tmp_path / "secret").write_bytes(SECRET + b"\n")
    broker = ["broker", "--secret-file", str(tmp_path / "secret"), "--nats", OPEN_BUS]
    proxy = ["proxy", "--nats", OPEN_BUS, "--token", "t", "--api", "https://x"]
    for argv in (broker, proxy):
        refused = invoke(argv)
        assert refused.exit_code == 2, refused.output
        assert OPEN_BUS in said(refused) and "--insecure" in said(refused)
    files = {"broker": pki.node("broker", "b1"), "proxy": pki.node("proxy", "p1")}
    for argv in (broker, proxy):
        tls_dir = str(files[argv[0]].cert.parent)
        both = invoke([*argv, "--tls-dir", tls_dir, "--insecure"])
        assert both.exit_code == 2 and "drop one" in said(both)
