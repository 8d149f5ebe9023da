"""`souk certs public`: an ECDSA certificate for a public listener, which browsers take, issued
by a public CA of its own that clients trust; a TLS handshake checked against that CA works."""

from __future__ import annotations

import socket
import ssl
import threading
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric import ec

from tests.cli.conftest import souk


def test_a_public_certificate_is_ecdsa_and_verifies_against_its_ca(tmp_path: Path) -> None:
    done = souk(
        "certs", "public", "--ca-dir", "public-ca", "--name", "localhost", "--san", "127.0.0.1",
        "--out", "tls-public", cwd=tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    cert, key = tmp_path / "tls-public" / "localhost.crt", tmp_path / "tls-public" / "localhost.key"
    assert (key.stat().st_mode & 0o777) == 0o600
    leaf = x509.load_pem_x509_certificates(cert.read_bytes())[0]
    assert isinstance(leaf.public_key(), ec.EllipticCurvePublicKey)

    server = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    server.load_cert_chain(cert, key)
    client = ssl.create_default_context(cafile=tmp_path / "public-ca" / "ca.crt")
    with socket.create_server(("127.0.0.1", 0)) as listener:
        port = listener.getsockname()[1]

        def accept() -> None:
            conn, _ = listener.accept()
            with server.wrap_socket(conn, server_side=True) as tls:
                tls.sendall(b"ok")

        thread = threading.Thread(target=accept)
        thread.start()
        with (
            socket.create_connection(("127.0.0.1", port)) as raw,
            client.wrap_socket(raw, server_hostname="127.0.0.1") as tls,
        ):
            assert tls.recv(2) == b"ok"
        thread.join(5)

    again = souk(
        "certs", "public", "--ca-dir", "public-ca", "--name", "localhost", "--out", "tls-2",
        cwd=tmp_path,
    )  # fmt: skip
    assert again.returncode == 0  # the CA is kept: what clients trust stays good
    assert (tmp_path / "public-ca" / "ca.crt").read_bytes() in (
        tmp_path / "tls-2" / "localhost.crt"
    ).read_bytes()
