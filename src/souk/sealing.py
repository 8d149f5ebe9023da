"""Sealing: values encrypted with a key derived from a secret, so that databases and catalog rows
that carry them never hold them in plain text.

The broker seals app metadata under `sealed.` and app secrets with a key derived from the
cluster secret (HKDF-SHA256), which every broker holds and nothing else needs; a worker seals
the secrets of the machines it runs with a key of its own (`worker_key`). Each value is sealed
with AES-256-GCM under a fresh random nonce, bound to its app and key (associated data), so a
sealed value copied to another key or app does not open.

Sealed metadata: values of keys under `sealed.` are encrypted by the broker before the app
registry stores them. On the way out, a broker opens them for tokens that may deploy the app,
and leaves them out for every other token. App secrets are never opened for any caller: only
for the worker that runs a machine of the app (see docs/security.md).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
from pathlib import Path

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives import hashes
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from cryptography.hazmat.primitives.kdf.hkdf import HKDF

from souk.models.wire import SEALED_PREFIX
from souk.secret_files import write_secret

ENVELOPE = "souk-sealed-1:"  # what a stored sealed value starts with
NONCE_BYTES = 12
_INFO = b"souk app metadata sealing v1"
_DIGEST_INFO = b"souk secret digests v1"
WORKER_KEY_FILE = "sealing.key"


class Unsealable(Exception):
    """A stored sealed value that does not open: sealed under another cluster secret, or
    damaged."""

    def __init__(self, key: str) -> None:
        super().__init__(
            f"metadata key {key!r} was sealed under another cluster secret, or is damaged;"
            " delete it and set it again"
        )
        self.key = key


def is_sealed(key: str) -> bool:
    return key.startswith(SEALED_PREFIX)


class Sealer:
    def __init__(self, secret: bytes) -> None:
        hkdf = HKDF(algorithm=hashes.SHA256(), length=32, salt=None, info=_INFO)
        self._aead = AESGCM(hkdf.derive(secret))
        self._digest_key = HKDF(
            algorithm=hashes.SHA256(), length=32, salt=None, info=_DIGEST_INFO
        ).derive(secret)

    def seal(self, app: str, key: str, value: str) -> str:
        nonce = os.urandom(NONCE_BYTES)
        sealed = self._aead.encrypt(nonce, value.encode(), _bound(app, key))
        return ENVELOPE + base64.urlsafe_b64encode(nonce + sealed).decode()

    def open(self, app: str, key: str, stored: str) -> str:
        if not stored.startswith(ENVELOPE):
            raise Unsealable(key)
        try:
            raw = base64.urlsafe_b64decode(stored[len(ENVELOPE) :].encode())
            plain = self._aead.decrypt(raw[:NONCE_BYTES], raw[NONCE_BYTES:], _bound(app, key))
            return plain.decode()
        except (binascii.Error, ValueError, InvalidTag):
            raise Unsealable(key) from None

    def digest(self, app: str, key: str, value: str) -> str:
        """A short keyed digest of a value: tells two values apart (was it changed?) without
        letting anyone who reads it, and lacks the secret, test guesses of the value."""
        mac = hmac.new(self._digest_key, _bound(app, key) + b"\0" + value.encode(), "sha256")
        return mac.hexdigest()[:16]

    def seal_changes(self, app: str, changes: dict[str, str]) -> dict[str, str]:
        """The values to store for a patch's `set`: those of sealed keys sealed."""
        return {k: self.seal(app, k, v) if is_sealed(k) else v for k, v in changes.items()}

    def shown(self, app: str, metadata: dict[str, str], may_open: bool) -> dict[str, str]:
        """The metadata as a caller sees it: sealed values opened for one that may, left out
        for any other."""
        if not may_open:
            return {k: v for k, v in metadata.items() if not is_sealed(k)}
        return {k: self.open(app, k, v) if is_sealed(k) else v for k, v in metadata.items()}


def _bound(app: str, key: str) -> bytes:
    return f"{app}\0{key}".encode()


def worker_key(data_dir: Path) -> bytes:
    """The worker's own sealing key, made on first use: a file of 32 random bytes, mode 0600
    from the moment it exists, kept next to the database it protects."""
    path = data_dir / WORKER_KEY_FILE
    try:
        write_secret(path, os.urandom(32), replace=False)
    except FileExistsError:
        pass
    key = path.read_bytes()
    if len(key) != 32:
        raise ValueError(f"{path}: a sealing key is 32 bytes; this file holds {len(key)}")
    return key
