"""Certificates for what browsers open: a broker's or a proxy's public listener (`--tls-cert`).

The cluster's own PKI is Ed25519 (small, fast keys for every internal hop and catalog row), but
browsers take no Ed25519 certificate, in the chain or at its end: Chromium ends the handshake.
A public listener therefore shows an ECDSA P-256 certificate, issued by a CA of its own (also
P-256), kept apart from the cluster CA: it says who serves a name, never what a part may do.
"""

from __future__ import annotations

from collections.abc import Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID

from souk.pki.files import CA_CERT, CERT_MODE, KEY_MODE, make_dir
from souk.pki.identity import PkiError
from souk.pki.issue import CA_DAYS, builder, self_signed, subject, with_sans
from souk.secret_files import write_file

PUBLIC_DAYS = 90  # what browsers accept of a certificate's life, with room to renew
PUBLIC_CA_KEY = "public-ca.key"


def _pem_key(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    )


def init_public_ca(directory: Path, common_name: str = "souk public CA") -> Path:
    """The public CA in `directory` (its key 0600, its certificate `ca.crt`), made once and kept:
    a browser or client told to trust it stays good across renewals. Returns the certificate."""
    make_dir(directory)
    cert_path = directory / CA_CERT
    if (directory / PUBLIC_CA_KEY).exists() and cert_path.exists():
        return cert_path
    key = ec.generate_private_key(ec.SECP256R1())
    cert = self_signed(key, common_name, CA_DAYS, datetime.now(UTC))
    write_file(directory / PUBLIC_CA_KEY, _pem_key(key), mode=KEY_MODE, replace=True)
    write_file(
        cert_path, cert.public_bytes(serialization.Encoding.PEM), mode=CERT_MODE, replace=True
    )
    return cert_path


def issue_public(
    ca_dir: Path, out: Path, name: str, sans: Sequence[str] = (), days: int = PUBLIC_DAYS
) -> tuple[Path, Path]:
    """A P-256 key and a certificate for serving `name` (and `sans`: names or addresses) over
    HTTPS, signed by the public CA in `ca_dir`: `out/NAME.crt` (with the CA after it, the chain
    a listener sends) and `out/NAME.key` (0600)."""
    try:
        ca_key = serialization.load_pem_private_key((ca_dir / PUBLIC_CA_KEY).read_bytes(), None)
        ca_cert = x509.load_pem_x509_certificate((ca_dir / CA_CERT).read_bytes())
    except (OSError, ValueError) as exc:
        raise PkiError(f"no public CA in {ca_dir}: {exc}") from exc
    if not isinstance(ca_key, ec.EllipticCurvePrivateKey):
        raise PkiError(f"{ca_dir / PUBLIC_CA_KEY} is not an ECDSA key")
    key = ec.generate_private_key(ec.SECP256R1())
    now = datetime.now(UTC)
    not_after = min(now + timedelta(days=days), ca_cert.not_valid_after_utc)
    cert = (
        builder(subject(name), ca_cert.subject, key.public_key(), now, not_after, ca=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(x509.SubjectAlternativeName(with_sans([], (name, *sans))), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    make_dir(out)
    cert_path, key_path = out / f"{name}.crt", out / f"{name}.key"
    write_file(key_path, _pem_key(key), mode=KEY_MODE, replace=True)
    chain = cert.public_bytes(serialization.Encoding.PEM) + (ca_dir / CA_CERT).read_bytes()
    write_file(cert_path, chain, mode=CERT_MODE, replace=True)
    return cert_path, key_path
