"""The app secrets a machine runs with, as its worker keeps them.

The broker opens an app's secrets when it creates or updates a machine and sends them beside
the config; the worker must start the machine again later without asking anyone (a restart
after a crash, a wake by the proxy, its own restart), so it keeps them, sealed with a key of its
own (`souk.sealing.worker_key`) in a table no catalog row is made from. They are opened at each
start, into the machine's environment and its `files`."""

from __future__ import annotations

import json

from souk.models.machine import MachineConfig
from souk.sealing import WORKER_KEY_FILE, Sealer, Unsealable
from souk.worker.state import queries
from souk.worker.state.queries import Db
from souk.worker.state.store import Tx

_KEY = "secrets"


def record(tx: Tx, sealer: Sealer, app: str, machine_id: str, secrets: dict[str, str]) -> None:
    """What the machine's last create or update brought replaces what it had."""
    sealed = sealer.seal(f"{app}/{machine_id}", _KEY, json.dumps(secrets)) if secrets else None
    queries.set_machine_secrets(tx, machine_id, sealed)


class SecretsUnreadable(RuntimeError):
    """The machine's secrets do not open with this worker's key: the start fails, saying so."""


def opened(db: Db, sealer: Sealer, app: str, machine_id: str) -> dict[str, str]:
    sealed = queries.machine_secrets(db, machine_id)
    if sealed is None:
        return {}
    try:
        found: dict[str, str] = json.loads(sealer.open(f"{app}/{machine_id}", _KEY, sealed))
    except Unsealable:
        raise SecretsUnreadable(
            f"the secrets of machine {machine_id} do not open with this worker's key"
            f" ({WORKER_KEY_FILE} replaced?); update the machine to send them again"
        ) from None
    return found


def with_env(config: MachineConfig, secrets: dict[str, str]) -> MachineConfig:
    """The config a start launches: every secret an environment variable, over `env`'s value of
    the same name (as Fly does)."""
    if not secrets:
        return config
    return config.model_copy(update={"env": {**config.env, **secrets}})
