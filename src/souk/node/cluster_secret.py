"""The cluster secret's file: made (0600, by `secret_files`) and read only here, so the broker,
the catalog, the token commands and `souk dev` hold one rule for what a secret is."""

from __future__ import annotations

import contextlib
import secrets
from pathlib import Path

from souk.secret_files import write_secret

MIN_SECRET_BYTES = 16


def check_secret(secret: bytes) -> None:
    if len(secret) < MIN_SECRET_BYTES:
        raise ValueError(f"the cluster secret must be at least {MIN_SECRET_BYTES} bytes")


def new_secret() -> bytes:
    """A fresh cluster secret, printable so it can live in a file or an environment variable."""
    return secrets.token_hex(32).encode()


def read_secret(path: Path) -> bytes:
    secret = path.read_bytes().strip()
    check_secret(secret)
    return secret


def create_secret(path: Path, *, replace: bool = False) -> None:
    """A new secret at `path`; FileExistsError if one is there and `replace` is not given."""
    write_secret(path, new_secret() + b"\n", replace=replace)


def kept_secret(path: Path) -> bytes:
    """The secret at `path`, made first if there is none: kept across runs, its tokens stay
    valid."""
    with contextlib.suppress(FileExistsError):
        create_secret(path)
    return read_secret(path)
