"""App secrets as the broker handles them: sealed (see `souk.sealing`) before the app registry
stores them, so the registry's database and the catalog rows that carry them to every replica
hold no value in plain text; opened again only when a machine of the app is created or updated,
and then sent to the worker that runs it, over its mutual-TLS API, beside the machine's config
(never in it: a config is what GET shows, and what catalog rows are made from).

Every secret is bound to its app and name: a sealed value copied into another app's row does
not open."""

from __future__ import annotations

import base64
import binascii

from souk.broker.errors import Refused
from souk.models.catalog import AppRow
from souk.models.machine_config import MachineConfig
from souk.models.secrets import MAX_SECRET_BYTES, SECRET_NAME, SecretRecord
from souk.sealing import Sealer, Unsealable


class SecretRefused(Refused):
    """Bad input about secrets."""


def _key(name: str) -> str:
    return f"secret:{name}"  # distinct from every metadata key: a metadata key has no ':' first


def check_secret(name: str, value: str) -> None:
    if not SECRET_NAME.match(name):
        raise SecretRefused(
            "invalid",
            f"bad secret name {name[:140]!r}: a letter or _, then letters, digits or _, at"
            " most 128 (it becomes an environment variable)",
        )
    if "\0" in value:
        raise SecretRefused("invalid", f"secret {name}: a value cannot hold a NUL character")
    if len(value.encode()) > MAX_SECRET_BYTES:
        raise SecretRefused(
            "secret_too_large", f"secret {name}: at most {MAX_SECRET_BYTES >> 10} KiB"
        )


def seal_secret(sealer: Sealer, app: str, name: str, value: str, stamp: str) -> SecretRecord:
    check_secret(name, value)
    return SecretRecord(
        sealed=sealer.seal(app, _key(name), value),
        digest=sealer.digest(app, _key(name), value),
        created_at=stamp,
        updated_at=stamp,
    )


def open_secrets(sealer: Sealer, row: AppRow) -> dict[str, str]:
    """Every secret of the app, opened: what its machines get."""
    try:
        return {n: sealer.open(row.name, _key(n), r.sealed) for n, r in row.secrets.items()}
    except Unsealable as exc:
        name = exc.key.removeprefix("secret:")
        raise SecretRefused(
            "sealed_unreadable",
            f"secret {name} of app {row.name} was sealed under another cluster secret, or is"
            " damaged; set it again",
        ) from None


def check_files(config: MachineConfig, secrets: dict[str, str]) -> None:
    """Each file that names a secret names one the app has, holding base64 (Fly's rule for
    file secrets); refused here, where the values are known, rather than at the machine's
    start on a worker."""
    for i, file in enumerate(config.files):
        if file.secret_name is None:
            continue
        where = f"config.files[{i}].secret_name"
        value = secrets.get(file.secret_name)
        if value is None:
            raise SecretRefused(
                "unknown_secret", f"{where}: the app has no secret {file.secret_name!r}"
            )
        try:
            base64.b64decode(value, validate=True)
        except (binascii.Error, ValueError):
            raise SecretRefused(
                "invalid",
                f"{where}: secret {file.secret_name} is not base64; a file's secret holds"
                " its content base64-encoded",
            ) from None
