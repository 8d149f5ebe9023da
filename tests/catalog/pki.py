"""A cluster CA and node certificates for tests, made with `cryptography` as the cluster PKI
makes them: Ed25519 keys, subject O=souk, OU=<role>, CN=<name>, URI name souk://<role>/<name>."""

from __future__ import annotations

import ipaddress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from souk.catalog.signing import Ed25519Signer
from souk.catalog.trust import CaTrust


def _name(*attrs: tuple[x509.ObjectIdentifier, str]) -> x509.Name:
    return x509.Name([x509.NameAttribute(oid, value) for oid, value in attrs])


@dataclass
class NodeCert:
    role: str
    name: str
    key: Ed25519PrivateKey
    cert: x509.Certificate

    @property
    def der(self) -> bytes:
        return self.cert.public_bytes(serialization.Encoding.DER)

    def signer(self) -> Ed25519Signer:
        seed = self.key.private_bytes(
            serialization.Encoding.Raw,
            serialization.PrivateFormat.Raw,
            serialization.NoEncryption(),
        )
        return Ed25519Signer(seed, self.der)

    def write(self, directory: Path) -> tuple[Path, Path]:
        """Its certificate and key as PEM files: (cert, key)."""
        cert = directory / f"{self.role}-{self.name}.crt"
        key = directory / f"{self.role}-{self.name}.key"
        cert.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        key.write_bytes(
            self.key.private_bytes(
                serialization.Encoding.PEM,
                serialization.PrivateFormat.PKCS8,
                serialization.NoEncryption(),
            )
        )
        return cert, key


@dataclass
class Ca:
    key: Ed25519PrivateKey = field(default_factory=Ed25519PrivateKey.generate)
    common_name: str = "souk test CA"

    def __post_init__(self) -> None:
        now = datetime.now(UTC)
        subject = _name(
            (NameOID.ORGANIZATION_NAME, "souk"), (NameOID.COMMON_NAME, self.common_name)
        )
        self.cert = (
            x509.CertificateBuilder()
            .subject_name(subject)
            .issuer_name(subject)
            .public_key(self.key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5))
            .not_valid_after(now + timedelta(days=30))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .sign(self.key, None)
        )

    def trust(self) -> CaTrust:
        return CaTrust(self.cert)

    def node(self, role: str, name: str, days: float = 1, ips: tuple[str, ...] = ()) -> NodeCert:
        now = datetime.now(UTC)
        key = Ed25519PrivateKey.generate()
        sans: list[x509.GeneralName] = [
            x509.UniformResourceIdentifier(f"souk://{role}/{name}"),
            x509.DNSName(name),
            *(x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips),
        ]
        usages = [ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH]
        cert = (
            x509.CertificateBuilder()
            .subject_name(
                _name(
                    (NameOID.ORGANIZATION_NAME, "souk"),
                    (NameOID.ORGANIZATIONAL_UNIT_NAME, role),
                    (NameOID.COMMON_NAME, name),
                )
            )
            .issuer_name(self.cert.subject)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - timedelta(minutes=5) - timedelta(days=max(0, -days)))
            .not_valid_after(now + timedelta(days=days))
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .add_extension(x509.ExtendedKeyUsage(usages), critical=False)
            .add_extension(x509.SubjectAlternativeName(sans), critical=False)
            .sign(self.key, None)
        )
        return NodeCert(role, name, key, cert)

    def write(self, directory: Path) -> Path:
        path = directory / "ca.crt"
        path.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        return path
