"""The catalog's side of the cluster PKI (`souk.pki`): which certified node may sign which
owner's rows, the certificates met on the bus, and a node's signer and bus connection made from
its node files (`souk certs issue --out DIR`). Certificates are read by `souk.pki` alone."""

from __future__ import annotations

from collections.abc import Sequence
from datetime import datetime
from typing import Any

from cryptography import x509
from cryptography.hazmat.primitives.serialization import Encoding

from souk.catalog.permissions import inbox_prefix
from souk.catalog.protocol import REGISTRY_OWNER
from souk.catalog.signing import Ed25519Signer
from souk.pki import (
    Identity,
    NodeFiles,
    PkiError,
    client_context,
    identity_of,
    load_cert,
    load_key,
    verify_issued_by_one_of,
)

WORKER = "worker"  # signs its own rows: its certificate's name is its worker id
BROKER = "broker"  # signs the app registry's rows


def signs_for(identity: Identity) -> str | None:
    """The one owner whose rows `identity` may sign, or None if it may sign none."""
    if identity.role == BROKER:
        return REGISTRY_OWNER
    if identity.role == WORKER and identity.name != REGISTRY_OWNER:
        return identity.name
    return None


def certified(der: bytes, cas: Sequence[x509.Certificate], now: datetime) -> Identity:
    """Who a certificate met on the bus (DER) speaks for, once one of `cas` is found to have
    issued it and it is valid at `now`; PkiError otherwise."""
    try:
        cert = x509.load_der_x509_certificate(der)
    except ValueError as exc:
        raise PkiError(f"not a certificate: {exc}") from None
    verify_issued_by_one_of(cert, cas, now)
    return identity_of(cert)


def load_signer(files: NodeFiles, owner: str) -> Ed25519Signer:
    """The signer of `owner`'s rows, from a node's files; PkiError, at start rather than in
    every replica's refusals, if they are not a valid pair from the CA beside them or their
    certificate may not sign that owner's rows."""
    identity = files.check()
    if signs_for(identity) != owner:
        raise PkiError(f"a {identity.role} named {identity.name!r} may not sign {owner!r}'s rows")
    seed = load_key(files.key).private_bytes_raw()
    return Ed25519Signer(seed, load_cert(files.cert).public_bytes(Encoding.DER))


def bus_options(files: NodeFiles) -> dict[str, Any]:
    """`NatsBus.connect` options for a node on the authenticated bus: mutual TLS with its
    certificate (the server checked against the CA and the URL's host), and replies in the
    inbox only it may read; the bus vouches for who publishes on an owner's subject (a replica
    then audits live batches rather than checking each, see `souk.catalog.sync.audit`)."""
    identity = files.check()
    return {
        "tls": client_context(files),
        "inbox_prefix": inbox_prefix(identity.role, identity.name),
        "authenticated": True,
    }
