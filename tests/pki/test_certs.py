"""Certificates issued by the CA say who they speak for, and nothing malformed is taken for an
identity."""

from __future__ import annotations

import ipaddress
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives.asymmetric.ec import SECP256R1, generate_private_key
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from souk.pki import (
    ROLES,
    PkiError,
    identity_of,
    issue,
    new_ca,
    new_key,
    verify_issued_by,
)
from souk.pki.identity import check_name
from tests.support.pki import forged

NOW = datetime(2030, 6, 1, 12, 0, tzinfo=UTC)


@pytest.fixture(scope="module")
def ca() -> tuple[Ed25519PrivateKey, x509.Certificate]:
    key = new_key()
    return key, new_ca(key, now=NOW)


def forge(
    ca: tuple[Ed25519PrivateKey, x509.Certificate], *args: Any, **kwargs: Any
) -> x509.Certificate:
    return forged(*ca, *args, now=NOW, **kwargs)


def test_a_node_certificate_carries_role_and_name(ca: tuple[Ed25519PrivateKey, x509.Certificate]):
    ca_key, ca_cert = ca
    node_key = new_key()
    cert = issue(
        ca_key, ca_cert, node_key, "worker", "mad-1", ["10.0.0.7", "mad-1.internal"], now=NOW
    )

    ident = identity_of(cert)
    assert (ident.role, ident.name, ident.uri) == ("worker", "mad-1", "souk://worker/mad-1")
    assert ident.not_after == NOW + timedelta(days=30)
    assert ident.public_key.public_bytes_raw() == node_key.public_key().public_bytes_raw()
    subject = {a.oid: a.value for a in cert.subject}
    assert subject == {
        NameOID.ORGANIZATION_NAME: "souk",
        NameOID.ORGANIZATIONAL_UNIT_NAME: "worker",
        NameOID.COMMON_NAME: "mad-1",
    }
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert san.get_values_for_type(x509.DNSName) == ["mad-1", "mad-1.internal"]
    assert san.get_values_for_type(x509.IPAddress) == [ipaddress.ip_address("10.0.0.7")]
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert set(usage) == {ExtendedKeyUsageOID.SERVER_AUTH, ExtendedKeyUsageOID.CLIENT_AUTH}
    verify_issued_by(cert, ca_cert, now=NOW + timedelta(days=1))


def test_the_node_key_signs_what_its_identity_verifies(ca):
    """The same key signs catalog rows: its certificate's public key checks those signatures."""
    ca_key, ca_cert = ca
    node_key = new_key()
    ident = identity_of(issue(ca_key, ca_cert, node_key, "broker", "b1", now=NOW))
    ident.public_key.verify(node_key.sign(b"row"), b"row")


def test_the_ca_may_sign_node_certificates_only(ca):
    _, ca_cert = ca
    constraints = ca_cert.extensions.get_extension_for_class(x509.BasicConstraints).value
    assert constraints.ca and constraints.path_length == 0
    assert ca_cert.not_valid_after_utc == NOW + timedelta(days=3650)
    with pytest.raises(PkiError, match="exactly O=souk"):
        identity_of(ca_cert)


@pytest.mark.parametrize("role", ROLES)
def test_every_role_round_trips(ca, role: str):
    ca_key, ca_cert = ca
    assert identity_of(issue(ca_key, ca_cert, new_key(), role, "n1", now=NOW)).role == role


@pytest.mark.parametrize(
    ("role", "name", "message"),
    [
        ("admin", "n1", "unknown role"),
        ("worker", "Mad_1", "bad name"),
        ("worker", "-mad", "bad name"),
        ("worker", "a" * 64, "bad name"),
        ("worker", "", "bad name"),
        ("worker", "mad/1", "bad name"),
    ],
)
def test_issue_refuses_bad_roles_and_names(ca, role: str, name: str, message: str):
    ca_key, ca_cert = ca
    with pytest.raises(PkiError, match=message):
        issue(ca_key, ca_cert, new_key(), role, name, now=NOW)


def test_names_are_dns_names():
    assert check_name("mad-1.eu.example") == "mad-1.eu.example"
    with pytest.raises(PkiError):
        check_name("x." * 127 + "x")  # 255 characters


def test_issue_refuses_outliving_the_ca(ca):
    ca_key, ca_cert = ca
    with pytest.raises(PkiError, match="the CA expires"):
        issue(ca_key, ca_cert, new_key(), "worker", "w1", days=3651, now=NOW)


# Certificates built by hand, signed by the cluster CA, each wrong in one way.

ORG, OU, CN = NameOID.ORGANIZATION_NAME, NameOID.ORGANIZATIONAL_UNIT_NAME, NameOID.COMMON_NAME
GOOD_SUBJECT = [(ORG, "souk"), (OU, "worker"), (CN, "w1")]
GOOD_NAMES: list[x509.GeneralName] = [
    x509.UniformResourceIdentifier("souk://worker/w1"),
    x509.DNSName("w1"),
]

Forgery = Callable[[tuple[Ed25519PrivateKey, x509.Certificate]], x509.Certificate]
FORGERIES: dict[str, tuple[Forgery, str]] = {
    "good": (lambda ca: forge(ca, GOOD_SUBJECT, GOOD_NAMES), ""),
    "other organization": (
        lambda ca: forge(ca, [(ORG, "acme"), (OU, "worker"), (CN, "w1")], GOOD_NAMES),
        "O is not 'souk'",
    ),
    "no role": (lambda ca: forge(ca, [(ORG, "souk"), (CN, "w1")], GOOD_NAMES), "exactly O=souk"),
    "two roles": (
        lambda ca: forge(ca, [*GOOD_SUBJECT, (OU, "broker")], GOOD_NAMES),
        "exactly O=souk",
    ),
    "extra attribute": (
        lambda ca: forge(ca, [*GOOD_SUBJECT, (NameOID.COUNTRY_NAME, "ES")], GOOD_NAMES),
        "exactly O=souk",
    ),
    "unknown role": (
        lambda ca: forge(ca, [(ORG, "souk"), (OU, "root"), (CN, "w1")], GOOD_NAMES),
        "unknown role",
    ),
    "no alternative names": (lambda ca: forge(ca, GOOD_SUBJECT, None), "lacks an extension"),
    "URI of another role": (
        lambda ca: forge(
            ca,
            GOOD_SUBJECT,
            [x509.UniformResourceIdentifier("souk://broker/w1"), x509.DNSName("w1")],
        ),
        "URI names say",
    ),
    "two souk URIs": (
        lambda ca: forge(
            ca, GOOD_SUBJECT, [*GOOD_NAMES, x509.UniformResourceIdentifier("souk://broker/w1")]
        ),
        "URI names say",
    ),
    "no URI": (lambda ca: forge(ca, GOOD_SUBJECT, [x509.DNSName("w1")]), "URI names say"),
    "no DNS name": (
        lambda ca: forge(ca, GOOD_SUBJECT, [x509.UniformResourceIdentifier("souk://worker/w1")]),
        "among its DNS names",
    ),
    "a CA": (lambda ca: forge(ca, GOOD_SUBJECT, GOOD_NAMES, is_ca=True), "CA certificate"),
    "ECDSA key": (
        lambda ca: forge(
            ca, GOOD_SUBJECT, GOOD_NAMES, key=generate_private_key(SECP256R1()).public_key()
        ),
        "not Ed25519",
    ),
}


@pytest.mark.parametrize("case", FORGERIES)
def test_identity_of_is_strict(ca, case: str):
    build, message = FORGERIES[case]
    cert = build(ca)
    if not message:
        assert identity_of(cert).uri == "souk://worker/w1"
        return
    with pytest.raises(PkiError, match=message):
        identity_of(cert)


def test_verify_issued_by_checks_signature_issuer_and_window(ca):
    ca_key, ca_cert = ca
    cert = issue(ca_key, ca_cert, new_key(), "proxy", "p1", days=10, now=NOW)
    verify_issued_by(cert, ca_cert, now=NOW)

    with pytest.raises(PkiError, match="expired"):
        verify_issued_by(cert, ca_cert, now=NOW + timedelta(days=11))
    with pytest.raises(PkiError, match="not valid before"):
        verify_issued_by(cert, ca_cert, now=NOW - timedelta(hours=1))

    # Another CA under the very same name: the issuer names match, the signature does not.
    impostor = new_ca(new_key(), now=NOW)
    assert impostor.subject == ca_cert.subject
    with pytest.raises(PkiError, match="signature is not the CA's"):
        verify_issued_by(cert, impostor, now=NOW)
    # A CA under another name.
    stranger = new_ca(new_key(), common_name="elsewhere", now=NOW)
    with pytest.raises(PkiError, match="not issued by this CA"):
        verify_issued_by(cert, stranger, now=NOW)
    # A node certificate is no issuer, even of itself.
    with pytest.raises(PkiError, match="not a CA"):
        verify_issued_by(cert, cert, now=NOW)


def test_verify_issued_by_refuses_an_expired_ca():
    ca_key = new_key()
    ca_cert = new_ca(ca_key, days=30, now=NOW)
    cert = issue(ca_key, ca_cert, new_key(), "worker", "w1", days=30, now=NOW)
    verify_issued_by(cert, ca_cert, now=NOW + timedelta(days=29))
    with pytest.raises(PkiError, match="CA certificate expired"):
        verify_issued_by(cert, ca_cert, now=NOW + timedelta(days=30, minutes=1))
