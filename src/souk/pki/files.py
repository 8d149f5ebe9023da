"""Keys and certificates on disk. A key file is created 0600 and filled under a temporary name,
then moved into place, so it is never readable by others nor seen half-written; certificates are
0644, directories 0700. A part reloading its files sees the old ones or the new, nothing between."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from datetime import datetime
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from souk.pki.identity import Identity, PkiError, check_name, check_role, identity_of
from souk.pki.issue import CA_DAYS, NODE_DAYS, issue, new_ca, new_key, verify_issued_by_one_of
from souk.secret_files import write_file

KEY_MODE = 0o600
CERT_MODE = 0o644
DIR_MODE = 0o700
CA_KEY = "ca.key"
CA_CERT = "ca.crt"


@dataclass(frozen=True)
class NodeFiles:
    """What a part is started with: its key and certificate, and the CA it trusts."""

    cert: Path
    key: Path
    ca: Path

    @classmethod
    def in_dir(cls, directory: Path, name: str) -> NodeFiles:
        return cls(directory / f"{name}.crt", directory / f"{name}.key", directory / CA_CERT)

    @classmethod
    def find(cls, directory: Path, name: str | None = None) -> NodeFiles:
        """The files of `name` in `directory`, or of the one NAME.key there if no name is given
        (`souk certs issue --out DIR` writes one per name)."""
        if name is None:
            keys = sorted(p.stem for p in directory.glob("*.key") if p.name != CA_KEY)
            if len(keys) != 1:
                found = ", ".join(keys) or "none"
                raise PkiError(f"{directory} should hold one NAME.key, not {found}; name one")
            name = keys[0]
        return cls.in_dir(directory, check_name(name))

    def check(self, role: str | None = None, now: datetime | None = None) -> Identity:
        """Who these files make a part, once checked as it starts rather than at its first
        handshake: the certificate issued by the CA beside it, valid now, a souk identity (of
        `role`, if given), and the key the certificate's."""
        cert = load_cert(self.cert)
        verify_issued_by_one_of(cert, load_cas(self.ca), now)
        ident = identity_of(cert)
        if role is not None and ident.role != role:
            raise PkiError(
                f"{self.cert} is the certificate of {ident.role} {ident.name}, not of a {role}"
            )
        key = load_key(self.key)
        if key.public_key().public_bytes_raw() != ident.public_key.public_bytes_raw():
            raise PkiError(f"{self.key} is not the key of {self.cert}")
        return ident


def make_dir(path: Path) -> None:
    path.mkdir(mode=DIR_MODE, parents=True, exist_ok=True)


def _write(path: Path, data: bytes, mode: int, replace: bool) -> None:
    try:
        write_file(path, data, mode=mode, replace=replace)
    except FileExistsError as exc:
        raise PkiError(f"{path} exists; pass --force to replace it") from exc


def save_key(path: Path, key: Ed25519PrivateKey, *, replace: bool = False) -> None:
    pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    _write(path, pem, KEY_MODE, replace)


def save_cert(path: Path, cert: x509.Certificate) -> None:
    _write(path, cert.public_bytes(serialization.Encoding.PEM), CERT_MODE, replace=True)


def load_key(path: Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(path.read_bytes(), password=None)
    except (OSError, ValueError, TypeError) as exc:
        raise PkiError(f"cannot read a private key from {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise PkiError(f"{path} holds a key that is not Ed25519")
    return key


def load_cert(path: Path) -> x509.Certificate:
    try:
        return x509.load_pem_x509_certificate(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise PkiError(f"cannot read a certificate from {path}: {exc}") from exc


def load_cas(path: Path) -> list[x509.Certificate]:
    """The CA certificates in a file (`ca.crt`: one, or the old and the new while the CA is
    replaced); PkiError if it holds none, or a certificate that is no CA."""
    try:
        cas = x509.load_pem_x509_certificates(path.read_bytes())
    except (OSError, ValueError) as exc:
        raise PkiError(f"cannot read a certificate from {path}: {exc}") from exc
    for cert in cas:
        try:
            is_ca = cert.extensions.get_extension_for_class(x509.BasicConstraints).value.ca
        except x509.ExtensionNotFound:
            is_ca = False
        if not is_ca:
            raise PkiError(
                f"{path} holds a certificate that is no CA: {cert.subject.rfc4514_string()}"
            )
    return cas


def init_ca(
    directory: Path,
    common_name: str = "souk cluster CA",
    days: int = CA_DAYS,
    force: bool = False,
    now: datetime | None = None,
) -> x509.Certificate:
    """A new CA in `directory`: ca.key (which signs every certificate of the cluster) and
    ca.crt (which every part trusts)."""
    make_dir(directory)
    key = new_key()
    cert = new_ca(key, common_name, days, now)
    save_key(directory / CA_KEY, key, replace=force)
    save_cert(directory / CA_CERT, cert)
    return cert


def issue_files(
    ca_dir: Path,
    out: Path,
    role: str,
    name: str,
    sans: Sequence[str] = (),
    days: int = NODE_DAYS,
    force: bool = False,
    reuse_key: bool = False,
    now: datetime | None = None,
) -> tuple[NodeFiles, x509.Certificate]:
    """NAME.key, NAME.crt and a copy of ca.crt in `out`. With `reuse_key` the certificate is
    renewed for the key already there, so what that key signed stays attributable."""
    check_role(role)
    check_name(name)
    ca_key = load_key(ca_dir / CA_KEY)
    ca_cert = load_cert(ca_dir / CA_CERT)
    make_dir(out)
    files = NodeFiles.in_dir(out, name)
    if reuse_key:
        key = load_key(files.key)
    else:
        if files.key.exists() and not force:
            raise PkiError(f"{files.key} exists; pass --force for a new key or --reuse-key")
        key = new_key()
    cert = issue(ca_key, ca_cert, key, role, name, sans, days, now)
    if not reuse_key:
        save_key(files.key, key, replace=force)
    save_cert(files.ca, ca_cert)
    save_cert(files.cert, cert)
    return files, cert
