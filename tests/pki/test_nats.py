"""nats-server (Go's TLS) takes the cluster's Ed25519 certificates: it serves with one, verifies
clients' against the cluster CA, and nats-py connects with `client_context`."""

from __future__ import annotations

import asyncio
import subprocess
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import nats
import pytest
from cryptography import x509
from nats.aio.client import Client

from souk.pki import NodeFiles, client_context, identity_of
from tests.support.nats import NATS, flushed, needs_nats
from tests.support.pki import LOOPBACK, Pki
from tests.support.ports import free_port
from tests.support.waiting import eventually, wait_until

pytestmark = [pytest.mark.integration, needs_nats]


@pytest.fixture
def bus(pki: Pki, tmp_path: Path) -> Iterator[tuple[int, NodeFiles]]:
    files = pki.node("bus", "nats-1")
    port = free_port()
    config = tmp_path / "nats.conf"
    config.write_text(
        f"""
listen: "{LOOPBACK}:{port}"
tls {{
  cert_file: "{files.cert}"
  key_file: "{files.key}"
  ca_file: "{files.ca}"
  verify: true
  timeout: 5
}}
"""
    )
    assert NATS is not None
    log = tmp_path / "nats.log"
    proc = subprocess.Popen([NATS, "-c", str(config), "-l", str(log), "-D"])  # -D: why it closes
    try:
        wait_until(lambda: log.exists() and "Server is ready" in log.read_text(), 10, "nats ready")
        yield port, files
    finally:
        proc.kill()
        proc.wait()
        if log.exists():  # captured: shown with a failure, to say why the server dropped a client
            print(log.read_text())


async def connect(port: int, files: NodeFiles, hostname: str = "nats-1") -> Client:
    return await nats.connect(
        f"tls://{LOOPBACK}:{port}",
        tls=client_context(files),
        tls_hostname=hostname,
        allow_reconnect=False,
        connect_timeout=5,
        max_reconnect_attempts=0,
    )


async def test_a_round_trip_over_mutual_tls(pki: Pki, bus: tuple[int, NodeFiles]):
    port, _ = bus
    worker = await connect(port, pki.node("worker", "w1"))
    broker = await connect(port, pki.node("broker", "b1"))
    try:
        sub = await broker.subscribe("souk.test")
        await flushed(broker)
        await worker.publish("souk.test", b"hello")
        await flushed(worker)  # at the server, not in the client's buffer, before the wait
        msg = await sub.next_msg(timeout=10)
        assert msg.data == b"hello"
        # nats-py keeps no public handle on its TLS stream; reach in once to see what was agreed.
        transport: Any = worker._transport
        conn = transport._io_writer.get_extra_info("ssl_object")
        assert conn.version() == "TLSv1.3"
        served = x509.load_der_x509_certificate(conn.getpeercert(binary_form=True))
        assert identity_of(served).uri == "souk://bus/nats-1"
    finally:
        await worker.close()
        await broker.close()


async def test_nats_server_refuses_certificates_it_cannot_verify(
    pki: Pki, other_pki: Pki, bus: tuple[int, NodeFiles], tmp_path: Path
):
    port, server_files = bus
    stranger = replace(other_pki.node("worker", "w1"), ca=server_files.ca)
    expired = pki.node("worker", "old", age_days=40)
    for files in (stranger, expired):
        with pytest.raises((OSError, asyncio.TimeoutError, nats.errors.Error)) as caught:
            client = await connect(port, files)
            await client.close()
        assert "certificate verify failed" not in str(caught.value)  # the server refused
    wanted = (
        "TLS handshake error: tls: failed to verify client certificate",
        "certificate signed by unknown authority",
        "certificate has expired",
    )

    def logged() -> bool:  # the server writes its log after it has refused the client
        log = (tmp_path / "nats.log").read_text()
        return all(line in log for line in wanted)

    await eventually(logged, 10)


async def test_a_client_refuses_a_bus_by_another_name(pki: Pki, bus: tuple[int, NodeFiles]):
    port, _ = bus
    with pytest.raises((OSError, nats.errors.Error)) as caught:
        client = await connect(port, pki.node("worker", "w1"), hostname="nats-2")
        await client.close()
    assert "nats-2" in str(caught.value)
