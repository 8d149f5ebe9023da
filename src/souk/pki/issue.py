"""The cluster CA and the node certificates it issues, all Ed25519; and what every souk
certificate is made of, the public listeners' (`public.py`) too."""

from __future__ import annotations

import ipaddress
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from cryptography import x509
from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.hazmat.primitives.asymmetric.types import CertificatePublicKeyTypes
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from souk.pki.identity import (
    ORGANIZATION,
    PkiError,
    check_name,
    check_role,
    identity_uri,
)

CA_DAYS = 3650  # the CA is replaced by hand, rarely; node certificates are the short-lived ones
NODE_DAYS = 30
_WHEN = "%Y-%m-%d %H:%M UTC"
CLOCK_SKEW = timedelta(minutes=5)  # a certificate is valid a little before it is made


def new_key() -> Ed25519PrivateKey:
    return Ed25519PrivateKey.generate()


def subject(common_name: str, role: str | None = None) -> x509.Name:
    """O=souk, then OU=role for a certificate that acts as one, then CN."""
    unit = [] if role is None else [x509.NameAttribute(NameOID.ORGANIZATIONAL_UNIT_NAME, role)]
    return x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, ORGANIZATION),
            *unit,
            x509.NameAttribute(NameOID.COMMON_NAME, common_name),
        ]
    )


def builder(
    name: x509.Name,
    issuer: x509.Name,
    public: CertificatePublicKeyTypes,
    not_before: datetime,
    not_after: datetime,
    *,
    ca: bool,
) -> x509.CertificateBuilder:
    """What every souk certificate starts with, the cluster's and the public ones alike: a CA's
    key signs certificates only (and no CA below it), any other's signs handshakes only."""
    return (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(issuer)
        .public_key(public)
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before - CLOCK_SKEW)
        .not_valid_after(not_after)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=0 if ca else None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=not ca,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=ca,
                crl_sign=ca,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
    )


def self_signed(
    key: Ed25519PrivateKey | ec.EllipticCurvePrivateKey,
    common_name: str,
    days: int,
    now: datetime,
) -> x509.Certificate:
    """A CA of its own key: Ed25519 (the cluster's) or ECDSA (the public one, which browsers
    take), each signed as its key type wants (Ed25519 hashes inside the signature)."""
    name = subject(common_name)
    public = key.public_key()
    algorithm = None if isinstance(key, Ed25519PrivateKey) else hashes.SHA256()
    return (
        builder(name, name, public, now, now + timedelta(days=days), ca=True)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .sign(key, algorithm)
    )


def new_ca(
    key: Ed25519PrivateKey,
    common_name: str = "souk cluster CA",
    days: int = CA_DAYS,
    now: datetime | None = None,
) -> x509.Certificate:
    """A self-signed CA that may sign node certificates only, not other CAs."""
    return self_signed(key, common_name, days, now or datetime.now(UTC))


def parse_san(value: str) -> x509.GeneralName:
    """An IP address if it reads as one, else a DNS name."""
    try:
        return x509.IPAddress(ipaddress.ip_address(value))
    except ValueError:
        return x509.DNSName(check_name(value.lower()))


def with_sans(names: Sequence[x509.GeneralName], sans: Sequence[str]) -> list[x509.GeneralName]:
    """`names`, then each of `sans` (a name or an address) not among them yet."""
    out = list(names)
    for value in sans:
        found = parse_san(value)
        if found not in out:
            out.append(found)
    return out


def issue(
    ca_key: Ed25519PrivateKey,
    ca_cert: x509.Certificate,
    node_key: Ed25519PrivateKey,
    role: str,
    name: str,
    sans: Sequence[str] = (),
    days: int = NODE_DAYS,
    now: datetime | None = None,
) -> x509.Certificate:
    """A certificate saying `node_key` belongs to `name` acting as `role`: subject
    O=souk, OU=role, CN=name; names souk://role/name and the DNS name `name`, then `sans`."""
    check_role(role)
    check_name(name)
    if days < 1:
        raise PkiError("a certificate must be valid for at least one day")
    now = now or datetime.now(UTC)
    not_after = now + timedelta(days=days)
    if not_after > ca_cert.not_valid_after_utc:
        raise PkiError(
            f"the CA expires on {ca_cert.not_valid_after_utc:%Y-%m-%d}, before this certificate "
            "would; issue a shorter one or make a new CA"
        )
    own = [x509.UniformResourceIdentifier(identity_uri(role, name)), x509.DNSName(name)]
    public = node_key.public_key()
    ca_public = ca_key.public_key()
    return (
        builder(subject(name, role), ca_cert.subject, public, now, not_after, ca=False)
        .add_extension(
            x509.ExtendedKeyUsage(
                [
                    ExtendedKeyUsageOID.SERVER_AUTH,
                    ExtendedKeyUsageOID.CLIENT_AUTH,
                ]
            ),
            critical=False,
        )
        .add_extension(x509.SubjectAlternativeName(with_sans(own, sans)), critical=False)
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(public), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_public), critical=False
        )
        .sign(ca_key, None)
    )


def verify_issued_by(
    cert: x509.Certificate, ca_cert: x509.Certificate, now: datetime | None = None
) -> None:
    """Raise PkiError unless `ca_cert` is a CA that signed `cert` and both are valid at `now`.
    For certificates met outside a TLS handshake, e.g. one carried with a signed catalog row."""
    verify_issued_by_one_of(cert, [ca_cert], now)


def verify_issued_by_one_of(
    cert: x509.Certificate, cas: Sequence[x509.Certificate], now: datetime | None = None
) -> x509.Certificate:
    """`verify_issued_by` against a bundle (the old and the new CA, while the CA is replaced):
    the CA that signed `cert`, once both are found valid at `now`. Each signature is checked
    once; PkiError with the first CA's reason if none signed it."""
    now = now or datetime.now(UTC)
    refused: PkiError | None = None
    for ca in cas:
        try:
            constraints = ca.extensions.get_extension_for_class(x509.BasicConstraints).value
        except x509.ExtensionNotFound:
            constraints = None
        try:
            if constraints is None or not constraints.ca:
                raise PkiError("the issuer given is not a CA certificate")
            try:
                cert.verify_directly_issued_by(ca)  # refuses another issuer name before any math
            except InvalidSignature as exc:
                raise PkiError("the certificate's signature is not the CA's") from exc
            except (ValueError, TypeError) as exc:
                raise PkiError(f"the certificate was not issued by this CA: {exc}") from exc
        except PkiError as exc:
            refused = refused or exc
            continue
        for what, c in (("CA certificate", ca), ("certificate", cert)):
            if now < c.not_valid_before_utc:
                raise PkiError(f"the {what} is not valid before {c.not_valid_before_utc:{_WHEN}}")
            if now > c.not_valid_after_utc:
                raise PkiError(f"the {what} expired on {c.not_valid_after_utc:{_WHEN}}")
        return ca
    raise refused or PkiError("no CA certificate to check against")
