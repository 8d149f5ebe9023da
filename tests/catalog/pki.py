"""A cluster CA and node certificates for tests, issued in memory by `souk.pki` (the files
written only when a test needs them, laid out as `souk certs issue` lays them out)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.serialization import Encoding

from souk.catalog.signing import Ed25519Signer
from souk.catalog.trust import CaTrust
from souk.pki import NodeFiles, issue, new_ca, new_key, save_cert, save_key


@dataclass
class NodeCert:
    role: str
    name: str
    key: Ed25519PrivateKey
    cert: x509.Certificate
    ca: x509.Certificate

    @property
    def der(self) -> bytes:
        return self.cert.public_bytes(Encoding.DER)

    def signer(self) -> Ed25519Signer:
        return Ed25519Signer(self.key.private_bytes_raw(), self.der)

    def write(self, directory: Path) -> NodeFiles:
        """NAME.key, NAME.crt and ca.crt in `directory`."""
        directory.mkdir(parents=True, exist_ok=True)
        files = NodeFiles.in_dir(directory, self.name)
        save_key(files.key, self.key, replace=True)
        save_cert(files.cert, self.cert)
        save_cert(files.ca, self.ca)
        return files


@dataclass
class Ca:
    key: Ed25519PrivateKey = field(default_factory=new_key)
    common_name: str = "souk test CA"

    def __post_init__(self) -> None:
        self.cert = new_ca(self.key, self.common_name)

    def trust(self) -> CaTrust:
        return CaTrust([self.cert])

    def node(
        self, role: str, name: str, days: int = 1, sans: Sequence[str] = (), age_days: int = 0
    ) -> NodeCert:
        """`age_days` back-dates it: issued 2 days ago for 1 day, it has expired."""
        key = new_key()
        now = datetime.now(UTC) - timedelta(days=age_days)
        cert = issue(self.key, self.cert, key, role, name, sans, days, now)
        return NodeCert(role, name, key, cert, self.cert)

    def write(self, directory: Path) -> Path:
        path = directory / "ca.crt"
        save_cert(path, self.cert)
        return path
