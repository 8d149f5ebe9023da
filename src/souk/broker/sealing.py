"""Sealed app metadata: the mechanism lives in `souk.sealing`, which the worker shares (it seals
the secrets a machine runs with); this name stays for the broker's modules."""

from souk.sealing import ENVELOPE, NONCE_BYTES, Sealer, Unsealable, is_sealed

__all__ = ["ENVELOPE", "NONCE_BYTES", "Sealer", "Unsealable", "is_sealed"]
