"""Releases: every deploy is numbered and recorded in the app's metadata, so that any client
can list them and roll back without a database of its own.

Keys (all in the app's metadata, values are strings):

- `release.N`: the JSON of release N (its souk.toml without the values of its env; its image,
  pinned to the digest its tag named then (`souk.cli.deploy.images`), or command; strategy,
  status). The env's values are the app's secrets: a deploy sets them there
  (`souk.cli.deploy.secrets`), and its machines get them from there;
- `sealed.release.N.env`: the env of a release recorded before env went to the app's secrets,
  as JSON, sealed by the broker: still read to roll back to such a release;
- `release.current`: the number of the last release that completed;
- at most the last KEEP_RELEASES releases are kept;
- `deploy.lock`: JSON `{owner, release, expires_at}` while a deploy runs (advisory: the machine
  leases are what keeps two deploys apart; this also covers an app with no machines yet).
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationError

from souk.cli.command import CommandError
from souk.cli.deploy.config import AppConfig
from souk.clients.machines import MachinesClient
from souk.models.wire import SEALED_PREFIX

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
    config: dict[str, Any]  # souk.toml; its env values are kept apart, sealed (`env_key`)
    env: list[str] = Field(default_factory=list)  # the names of its env variables
    # Its env values went to the app's secrets (every release since secrets exist); a release
    # without it kept them in `env_key`.
    env_as_secrets: bool = False
    description: str = ""
    created_at: str
    finished_at: str | None = None
    error: str | None = None

    @classmethod
    def of(
        cls,
        cfg: AppConfig,
        version: int,
        strategy: str,
        description: str,
        image: str | None = None,
    ) -> Release:
        """`image`: what the release runs, pinned (`souk.cli.deploy.images`); souk.toml's
        own stays in `config`."""
        config = cfg.model_dump(mode="json")
        config.pop("env", None)
        return cls(
            version=version,
            strategy=strategy,
            image=image or cfg.image,
            command=cfg.command,
            config=config,
            env=sorted(cfg.env),
            env_as_secrets=True,
            description=description,
            created_at=now_iso(),
        )

    def key(self) -> str:
        return f"{PREFIX}{self.version}"

    def env_key(self) -> str:
        return env_key(self.version)

    def encode(self) -> str:
        return self.model_dump_json(exclude_none=True)

    def what(self) -> str:
        """The image reference (its digest cut short), or the command, for tables."""
        if self.image:
            name, at, digest = self.image.partition("@")
            return f"{name}@{digest[:19]}" if at else name
        return " ".join(self.command or [])


class Lock(BaseModel):
    owner: str
    release: int
    expires_at: float


def env_key(version: int) -> str:
    return f"{SEALED_PREFIX}{PREFIX}{version}.env"


def recorded(record: Release) -> dict[str, str]:
    """The metadata keys that record a new release (its env values are in the app's secrets)."""
    return {record.key(): record.encode()}


def now_iso() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def is_release_key(key: str) -> bool:
    number = key[len(PREFIX) :]
    return key.startswith(PREFIX) and number.isascii() and number.isdigit()


class RollbackError(CommandError):
    """No release to go back to, or none to scale."""


def _release_numbers(meta: dict[str, str]) -> list[int]:
    return [int(k[len(PREFIX) :]) for k in meta if is_release_key(k)]


def _lock(raw: str | None) -> Lock | None:
    """The deploy lock if one is held and has not expired."""
    if not raw:
        return None
    try:
        lock = Lock.model_validate(json.loads(raw))
    except (ValueError, ValidationError):
        return None
    return lock if lock.expires_at > time.time() else None


@dataclass(frozen=True)
class AppRecord:
    """The app's metadata as a deploy reads it, parsed once a step: its releases (newest first,
    unreadable records skipped), the current one and the deploy lock. A step that changes the
    metadata reads a new record after, rather than re-reading pieces of it."""

    meta: dict[str, str]
    releases: list[Release]
    current: int | None
    lock: Lock | None

    @classmethod
    def of(cls, meta: dict[str, str]) -> AppRecord:
        found = []
        for key, value in meta.items():
            if not is_release_key(key):
                continue
            try:
                found.append(Release.model_validate_json(value))
            except ValidationError:
                continue
        found.sort(key=lambda r: r.version, reverse=True)
        value = meta.get(CURRENT, "")
        number = int(value) if value.isascii() and value.isdigit() else None
        return cls(meta, found, number, _lock(meta.get(LOCK)))

    @classmethod
    async def read(cls, api: MachinesClient, app: str) -> AppRecord:
        return cls.of(await api.app_metadata(app))

    def release(self, version: int | None) -> Release | None:
        return next((r for r in self.releases if r.version == version), None)

    def current_release(self) -> Release | None:
        return self.release(self.current)

    def holds(self, record: Release) -> bool:
        """Whether `record`'s key is taken already (by a deploy that got there first)."""
        return record.key() in self.meta

    def next_version(self) -> int:
        return max([0, *_release_numbers(self.meta)]) + 1

    def stale(self, newest: int) -> list[str]:
        """The keys of releases too old to keep once `newest` is recorded, and of their env."""
        gone = [n for n in _release_numbers(self.meta) if n <= newest - KEEP_RELEASES]
        kept_env = [env_key(n) for n in gone if env_key(n) in self.meta]
        return [f"{PREFIX}{n}" for n in gone] + kept_env

    def managed_names(self) -> set[str]:
        """The env names the current release set as secrets: what the next deploy may unset."""
        record = self.current_release()
        return set(record.env) if record is not None and record.env_as_secrets else set()

    def rollback_target(self, version: int | None = None) -> Release:
        """The release to deploy again. By default the one before the current; but when the
        newest release failed half way, the current one (its machines are back where they
        were)."""
        if version is not None:
            asked = self.release(version)
            if asked is None:
                raise RollbackError(f"no release {version}")
            return asked
        cur = self.current
        if cur is None:
            raise RollbackError("no release has completed yet: nothing to roll back to")
        newest = self.releases[0] if self.releases else None
        back = self.release(cur)
        failed = newest is not None and newest.version > cur and newest.status == "failed"
        if failed and back is not None:
            return back
        for r in self.releases:
            if r.version < cur and r.status == "complete":
                return r
        raise RollbackError(f"no completed release before the current one ({cur})")

    def deployable(self, record: Release) -> dict[str, Any]:
        """The release's souk.toml, to deploy it again. A release whose env went to the app's
        secrets comes back without env (the secrets stay as they are now, as on Fly). An older
        one's env values come from its sealed key, which the broker shows only to a token that
        may deploy the app; releases recorded before env was sealed carry it in their config."""
        config = dict(record.config)
        if record.image and config.get("image"):
            config["image"] = record.image  # the image it ran, pinned: not what the tag names now
        if not record.env or record.env_as_secrets:
            return config
        raw = self.meta.get(record.env_key())
        if raw is None:
            raise RollbackError(
                f"the environment of release {record.version} is sealed: it takes a token that"
                " may deploy the app to read it"
            )
        try:
            env = json.loads(raw)
        except ValueError:
            env = None
        if not isinstance(env, dict) or set(env) != set(record.env):
            raise RollbackError(f"the environment of release {record.version} is unreadable")
        return {**config, "env": env}
