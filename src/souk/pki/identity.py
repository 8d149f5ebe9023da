"""Who a certificate speaks for: its role and name, read strictly so a malformed one is refused
rather than half-understood."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import datetime

from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from cryptography.x509.oid import NameOID

ORGANIZATION = "souk"
URI_SCHEME = "souk"
# "bus" is the NATS server: a TLS server the other parts verify, never a caller of a worker.
ROLES: tuple[str, ...] = ("worker", "broker", "proxy", "operator", "bus")

# A DNS name, lower case, so it can stand in a DNS SAN and be checked as a TLS hostname.
_LABEL = r"[a-z0-9](?:[a-z0-9-]{0,61}[a-z0-9])?"
_NAME = re.compile(rf"^{_LABEL}(?:\.{_LABEL})*$")


class PkiError(ValueError):
    """A certificate, key or CA that souk cannot use, with the reason in the message."""


@dataclass(frozen=True)
class Identity:
    role: str
    name: str
    not_after: datetime  # aware, UTC
    public_key: Ed25519PublicKey

    @property
    def uri(self) -> str:
        return identity_uri(self.role, self.name)


def identity_uri(role: str, name: str) -> str:
    return f"{URI_SCHEME}://{role}/{name}"


def check_role(role: str) -> str:
    if role not in ROLES:
        raise PkiError(f"unknown role {role!r}; one of: {', '.join(ROLES)}")
    return role


def check_name(name: str) -> str:
    if len(name) > 253 or not _NAME.match(name):
        raise PkiError(
            f"bad name {name!r}: lower-case letters, digits and '-', in dot-separated labels "
            "of at most 63 characters (it is also the certificate's DNS name)"
        )
    return name


def _one(cert: x509.Certificate, oid: x509.ObjectIdentifier, what: str) -> str:
    values = cert.subject.get_attributes_for_oid(oid)
    if len(values) != 1:
        raise PkiError(f"the certificate's subject needs exactly one {what}, has {len(values)}")
    value = values[0].value
    if not isinstance(value, str):
        raise PkiError(f"the certificate's {what} is not text")
    return value


def identity_of(cert: x509.Certificate) -> Identity:
    """The role and name a souk node certificate was issued for. It does not check who signed it
    (see `verify_issued_by`); a TLS handshake against the cluster CA has already done that."""
    key = cert.public_key()
    if not isinstance(key, Ed25519PublicKey):
        raise PkiError("the certificate's key is not Ed25519")
    oids = sorted(attr.oid.dotted_string for attr in cert.subject)
    wanted = sorted(
        o.dotted_string
        for o in (NameOID.ORGANIZATION_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME, NameOID.COMMON_NAME)
    )
    if oids != wanted:
        raise PkiError("the certificate's subject must be exactly O=souk, OU=<role>, CN=<name>")
    if _one(cert, NameOID.ORGANIZATION_NAME, "O") != ORGANIZATION:
        raise PkiError(f"the certificate's O is not {ORGANIZATION!r}")
    role = check_role(_one(cert, NameOID.ORGANIZATIONAL_UNIT_NAME, "OU (role)"))
    name = check_name(_one(cert, NameOID.COMMON_NAME, "CN (name)"))
    try:
        constraints = cert.extensions.get_extension_for_class(x509.BasicConstraints).value
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except x509.ExtensionNotFound as exc:
        raise PkiError(f"the certificate lacks an extension: {exc}") from exc
    if constraints.ca:
        raise PkiError("a CA certificate is not a node's identity")
    uris = san.get_values_for_type(x509.UniformResourceIdentifier)
    ours = [u for u in uris if u.startswith(f"{URI_SCHEME}://")]
    if ours != [identity_uri(role, name)]:
        raise PkiError(
            f"the certificate's subject says {identity_uri(role, name)} but its URI names "
            f"say {ours or 'nothing'}"
        )
    if name not in san.get_values_for_type(x509.DNSName):
        raise PkiError(f"the certificate lacks its name {name!r} among its DNS names")
    return Identity(role=role, name=name, not_after=cert.not_valid_after_utc, public_key=key)
