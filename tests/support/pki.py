"""A cluster CA in a temporary directory, certificates issued from it, and aiohttp servers on
loopback behind real TLS: for the PKI's own tests and for the parts that use it."""

from __future__ import annotations

import contextlib
import ssl
from collections.abc import AsyncIterator, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from aiohttp import web
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from souk.pki import NodeFiles, init_ca, issue_files
from souk.pki.issue import new_key

LOOPBACK = "127.0.0.1"


def new_pki(tmp_path: Path, name: str = "ca") -> Pki:
    """A CA of its own under `tmp_path`; two made with different names trust nothing of the
    other's, though their CAs share a common name."""
    made = Pki(tmp_path, name)
    init_ca(made.ca_dir)
    return made


@dataclass
class Pki:
    """One cluster CA; `node` issues into a directory of its own per name."""

    root: Path
    name: str = "ca"

    @property
    def ca_dir(self) -> Path:
        return self.root / self.name

    def node(
        self,
        role: str,
        name: str,
        sans: Sequence[str] = (LOOPBACK,),
        days: int = 30,
        age_days: int = 0,
        reuse_key: bool = False,
    ) -> NodeFiles:
        """`age_days` back-dates the certificate: 40 with the default 30 days is expired."""
        now = datetime.now(UTC) - timedelta(days=age_days)
        out = self.root / f"{self.name}-nodes" / name
        files, _ = issue_files(
            self.ca_dir,
            out,
            role,
            name,
            sans,
            days,
            force=not reuse_key,
            reuse_key=reuse_key,
            now=now,
        )
        return files


@contextlib.asynccontextmanager
async def serving(app: web.Application, ctx: ssl.SSLContext | None) -> AsyncIterator[int]:
    """`app` on a loopback port, behind `ctx` (plain HTTP if None); yields the port."""
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, LOOPBACK, 0, ssl_context=ctx)
    await site.start()
    try:
        yield int(runner.addresses[0][1])
    finally:
        await runner.cleanup()


def forged(
    ca_key: Ed25519PrivateKey,
    ca_cert: x509.Certificate,
    subject: list[tuple[x509.ObjectIdentifier, str]],
    names: list[x509.GeneralName] | None,
    *,
    key: Any = None,
    is_ca: bool = False,
    now: datetime | None = None,
) -> x509.Certificate:
    """A certificate signed by the CA but built by hand, to be wrong in a chosen way."""
    now = now or datetime.now(UTC)
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([x509.NameAttribute(oid, value) for oid, value in subject]))
        .issuer_name(ca_cert.subject)
        .public_key(key if key is not None else new_key().public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - timedelta(minutes=5))
        .not_valid_after(now + timedelta(days=1))
        .add_extension(x509.BasicConstraints(ca=is_ca, path_length=None), critical=True)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()), critical=False
        )
    )
    if names is not None:
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, None)
