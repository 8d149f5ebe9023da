"""Whom a replica believes: an owner's rows count only if signed with a key whose certificate
the cluster CA issued, for the right role, to a node named like the owner.

`Trust` is the small interface the replica needs; `CaTrust` implements it over `certs`. A
certificate is self-proving (the CA signed it), so anyone may hand it over: owners answer for
their own, and snapshots carry the ones their rows need.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Protocol

from cryptography import x509

from souk.catalog.certs import certified, signs_for
from souk.catalog.signing import Ed25519Verifier, Verifier, fingerprint
from souk.pki import PkiError


class Refused(Exception):
    """A message or row not applied, with the reason a replica counts it under."""

    def __init__(self, reason: str, detail: str = "") -> None:
        super().__init__(f"{reason}: {detail}" if detail else reason)
        self.reason = reason


class Trust(Protocol):
    def learn(self, certificate: bytes) -> str:
        """Checks a certificate (DER) and keeps it; returns its fingerprint. Raises
        Refused("bad_certificate")."""
        ...

    def verifier(self, owner: str, fp: str) -> Verifier | None:
        """The key that may sign `owner`'s rows as certificate `fp`, or None if that certificate
        is unknown here. Raises Refused("wrong_owner") if it belongs to someone else, or
        Refused("bad_certificate") if it expired."""
        ...

    def certificate(self, fp: str) -> bytes | None:
        """A known certificate, to relay."""
        ...


@dataclass(frozen=True, slots=True)
class _Known:
    """A checked certificate, reduced to what each message needs of it."""

    der: bytes
    who: str  # "role 'name'", for refusals
    owner: str | None  # the one owner it may sign for (`certs.signs_for`)
    not_after: float  # seconds since the epoch
    verifier: Verifier


class CaTrust:
    """Certificates issued by the cluster CA (or by either of two while it is replaced),
    checked once each and kept by fingerprint."""

    def __init__(
        self, cas: Sequence[x509.Certificate], clock: Callable[[], float] = time.time
    ) -> None:
        self.cas = list(cas)
        self.clock = clock
        self.known: dict[str, _Known] = {}

    def learn(self, certificate: bytes) -> str:
        fp = fingerprint(certificate)
        if fp in self.known:
            return fp
        try:
            identity = certified(certificate, self.cas, datetime.fromtimestamp(self.clock(), UTC))
        except PkiError as exc:
            raise Refused("bad_certificate", str(exc)) from None
        self.known[fp] = _Known(
            certificate,
            f"{identity.role} {identity.name!r}",
            signs_for(identity),
            identity.not_after.timestamp(),
            Ed25519Verifier(identity.public_key.public_bytes_raw()),
        )
        return fp

    def verifier(self, owner: str, fp: str) -> Verifier | None:
        known = self.known.get(fp)
        if known is None:
            return None
        if known.owner != owner:
            raise Refused("wrong_owner", f"{known.who} may not sign {owner!r}'s rows")
        if self.clock() > known.not_after:
            raise Refused("bad_certificate", f"the certificate of {owner!r} expired")
        return known.verifier

    def certificate(self, fp: str) -> bytes | None:
        known = self.known.get(fp)
        return None if known is None else known.der
