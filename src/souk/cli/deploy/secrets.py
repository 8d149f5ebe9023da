"""A deploy's env, kept as the app's secrets: souk.toml's `env` values are set there (one
step, sealed by the broker), never in a release's record nor in a machine's config; variables a
deploy set before and the new souk.toml drops are unset. Secrets set with `souk secrets` are
left alone.

Every machine gets every secret of its app in its environment when it is created or updated,
so a changed value must reach the machines as a change of config: the deploy marks each machine
with a digest of all the app's secret digests (`SECRETS_KEY`), and the fingerprint that decides
which machines are outdated includes it."""

from __future__ import annotations

import hashlib

from souk.cli.deploy.config import SECRETS_KEY
from souk.cli.deploy.releases import AppRecord, Release
from souk.clients.machines import MachinesClient
from souk.models.secrets import AppSecret

__all__ = ["SECRETS_KEY", "carried", "current_digest", "sync_env"]


def secrets_digest(secrets: list[AppSecret]) -> str:
    """One digest of the app's secrets: changes when any value, or the set of names, does."""
    text = "\n".join(f"{s.name}={s.digest}" for s in sorted(secrets, key=lambda s: s.name))
    return hashlib.sha256(text.encode()).hexdigest()[:16] if secrets else ""


async def sync_env(api: MachinesClient, app: str, env: dict[str, str], known: AppRecord) -> str:
    """Set the env as the app's secrets, unset what the last release set and this one drops;
    the digest of the app's secrets afterwards."""
    gone = known.managed_names() - set(env)
    values: dict[str, str | None] = {**env, **dict.fromkeys(gone)}
    if values:
        return secrets_digest((await api.update_secrets(app, values)).secrets)
    return await current_digest(api, app)


async def current_digest(api: MachinesClient, app: str) -> str:
    return secrets_digest((await api.secrets(app)).secrets)


def carried(record: Release) -> bool:
    """Whether deploying `record` again leaves the secrets as they are (its env is in them)."""
    return record.env_as_secrets
