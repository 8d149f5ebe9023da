"""Node certificates, read with plain X.509 code: whether the cluster CA issued one, and which
role and name it gives (OU and CN). The catalog's only contact with certificate formats, kept in
one module so that it can follow the cluster PKI's own checks."""

from __future__ import annotations

import ssl
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from cryptography.x509.oid import NameOID

from souk.catalog.permissions import inbox_prefix
from souk.catalog.signing import Ed25519Signer


class CertificateError(ValueError):
    """A certificate the catalog cannot trust, with the reason."""


@dataclass(frozen=True)
class Identity:
    role: str
    name: str
    public_key: bytes  # raw Ed25519
    not_after: float  # seconds since the epoch


def load_ca(path: Path) -> x509.Certificate:
    return x509.load_pem_x509_certificate(path.read_bytes())


def certificate_der(path: Path) -> bytes:
    """The first certificate of a PEM file, as DER."""
    cert = x509.load_pem_x509_certificate(path.read_bytes())
    return cert.public_bytes(serialization.Encoding.DER)


def _one(cert: x509.Certificate, oid: x509.ObjectIdentifier, what: str) -> str:
    values = cert.subject.get_attributes_for_oid(oid)
    if len(values) != 1 or not isinstance(values[0].value, str):
        raise CertificateError(f"the certificate's subject needs exactly one {what}")
    return values[0].value


def identity_of(der: bytes, ca: x509.Certificate, now: float | None = None) -> Identity:
    """The role and name a certificate issued by `ca` gives its Ed25519 key; CertificateError if
    `ca` did not issue it, it is not valid now, or it names no role and name."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise CertificateError(f"not a certificate: {exc}") from None
    try:
        cert.verify_directly_issued_by(ca)
    except InvalidSignature:
        raise CertificateError("the certificate's signature is not the CA's") from None
    except (ValueError, TypeError) as exc:
        raise CertificateError(f"the certificate was not issued by the CA: {exc}") from None
    at = time.time() if now is None else now
    if not cert.not_valid_before_utc.timestamp() <= at <= cert.not_valid_after_utc.timestamp():
        raise CertificateError("the certificate is not valid now")
    key = cert.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise CertificateError("the certificate's key is not Ed25519")
    role = _one(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "OU (role)")
    name = _one(cert, NameOID.COMMON_NAME, "CN (name)")
    raw = key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return Identity(role, name, raw, cert.not_valid_after_utc.timestamp())


def load_signer(cert_path: Path, key_path: Path) -> Ed25519Signer:
    """The signer of a node: its private key (PEM, PKCS#8) and its certificate."""
    key = serialization.load_pem_private_key(key_path.read_bytes(), password=None)
    if not isinstance(key, Ed25519PrivateKey):
        raise CertificateError(f"{key_path}: not an Ed25519 key")
    seed = key.private_bytes(
        serialization.Encoding.Raw, serialization.PrivateFormat.Raw, serialization.NoEncryption()
    )
    return Ed25519Signer(seed, certificate_der(cert_path))


def role_and_name(cert_path: Path) -> tuple[str, str]:
    """Who a node's own certificate says it is (not checked against a CA: it is our own)."""
    cert = x509.load_pem_x509_certificate(cert_path.read_bytes())
    return (
        _one(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "OU (role)"),
        _one(cert, NameOID.COMMON_NAME, "CN (name)"),
    )


def client_tls(ca: Path, cert: Path, key: Path) -> ssl.SSLContext:
    """Mutual TLS to the bus: the server is checked against the cluster CA, and shows it this
    node's certificate."""
    context = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=str(ca))
    context.load_cert_chain(str(cert), str(key))
    return context


def bus_options(ca: Path, cert: Path, key: Path) -> dict[str, Any]:
    """`NatsBus.connect` options for a node on an authenticated bus: mutual TLS with its
    certificate, and replies in the inbox only it may read."""
    role, name = role_and_name(cert)
    return {"tls": client_tls(ca, cert, key), "inbox_prefix": inbox_prefix(role, name)}
