"""Releases: every deploy is numbered and recorded in the app's metadata, so that any client
can list them and roll back without a database of its own.

Keys (all in the app's metadata, values are strings):

- `release.N`: the JSON of release N (its souk.toml, image or command, strategy, status);
- `release.current`: the number of the last release that completed;
- at most the last KEEP_RELEASES releases are kept;
- `deploy.lock`: JSON `{owner, release, expires_at}` while a deploy runs (advisory: the machine
  leases are what keeps two deploys apart; this also covers an app with no machines yet).
"""

from __future__ import annotations

import json
import time
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ValidationError

from souk.cli.command import CommandError

PREFIX = "release."
CURRENT = "release.current"
LOCK = "deploy.lock"
KEEP_RELEASES = 100  # older records are deleted: an app's metadata is bounded (1,000 keys)

Status = Literal["deploying", "complete", "failed"]


class Release(BaseModel):
    version: int
    status: Status = "deploying"
    strategy: str
    image: str | None = None
    command: list[str] | None = None
    config: dict[str, Any]
    description: str = ""
    created_at: str
    finished_at: str | None = None
    error: str | None = None

    def key(self) -> str:
        return f"{PREFIX}{self.version}"

    def encode(self) -> str:
        return self.model_dump_json(exclude_none=True)

    def what(self) -> str:
        """The image reference, or the command, for tables."""
        return self.image or " ".join(self.command or [])


class Lock(BaseModel):
    owner: str
    release: int
    expires_at: float


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def releases(meta: dict[str, str]) -> list[Release]:
    """Every recorded release, newest first; unreadable records are skipped."""
    out = []
    for key, value in meta.items():
        if not is_release_key(key):
            continue
        try:
            out.append(Release.model_validate_json(value))
        except ValidationError:
            continue
    return sorted(out, key=lambda r: r.version, reverse=True)


def current(meta: dict[str, str]) -> int | None:
    value = meta.get(CURRENT, "")
    return int(value) if value.isascii() and value.isdigit() else None


def next_version(meta: dict[str, str]) -> int:
    return max([0, *(int(k[len(PREFIX) :]) for k in meta if is_release_key(k))]) + 1


def stale_releases(meta: dict[str, str], newest: int) -> list[str]:
    """The keys of releases too old to keep once `newest` is recorded."""
    return [
        k for k in meta if is_release_key(k) and int(k[len(PREFIX) :]) <= newest - KEEP_RELEASES
    ]


def is_release_key(key: str) -> bool:
    number = key[len(PREFIX) :]
    return key.startswith(PREFIX) and number.isascii() and number.isdigit()


class RollbackError(CommandError):
    """No release to go back to, or none to scale."""


def rollback_target(meta: dict[str, str], version: int | None = None) -> Release:
    """The release to deploy again. By default the one before the current; but when the newest
    release failed half way, the current one (its machines are back where they were)."""
    all_ = releases(meta)
    by_version = {r.version: r for r in all_}
    if version is not None:
        if version not in by_version:
            raise RollbackError(f"no release {version}")
        return by_version[version]
    cur = current(meta)
    if cur is None:
        raise RollbackError("no release has completed yet: nothing to roll back to")
    if all_ and all_[0].version > cur and all_[0].status == "failed" and cur in by_version:
        return by_version[cur]
    for r in all_:
        if r.version < cur and r.status == "complete":
            return r
    raise RollbackError(f"no completed release before the current one ({cur})")


def lock_of(meta: dict[str, str]) -> Lock | None:
    """The deploy lock if one is held and has not expired."""
    raw = meta.get(LOCK)
    if not raw:
        return None
    try:
        lock = Lock.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None
    return lock if lock.expires_at > time.time() else None
