"""The app registry: the one writer of the catalog's `apps` rows.

Every catalog row has exactly one writer. Apps have no worker to own them, so one explicit
owner, the registry, writes them all: a small SQLite database (an app row per app, versioned by
the registry's own sequence, exactly like a worker's rows) published through the catalog like
any other owner's. One broker of the cluster hosts it (`souk broker --app-registry DIR`); the
others forward app creates and deletes to that broker over HTTP and read apps from their
replica. App writes are rare, so one writer costs nothing; when its host is down, apps cannot
be created or deleted, while machines of existing apps keep being placed everywhere.

Apps also carry metadata, string keys to string values (deploys keep their releases there, as
JSON strings under `release.N`). The registry is its one writer too, so a patch is one
transaction here, and the row it publishes carries the whole map. Likewise the app's secrets,
sealed by the broker before they get here (see `souk.broker.secrets`): the registry's database
and the rows every replica applies hold only sealed values and keyed digests.

It also keeps the list of revoked token ids (`revocations` rows, on the same sequence as apps):
tokens are checked by every broker alone, so a revocation must reach every broker, and the
catalog already takes the registry's rows everywhere.
"""

from __future__ import annotations

import builtins
import json
import re
import secrets
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime
from pathlib import Path

from souk.broker.errors import Refused
from souk.catalog.protocol import GLOBAL_REGION, REGISTRY_OWNER, Change
from souk.models.catalog import AppRow, RevocationRow
from souk.models.secrets import MAX_SECRETS, SecretRecord
from souk.models.wire import NETWORK_KEY
from souk.schema import Schema, add_missing_columns, migrate, together
from souk.secret_files import private_database

METADATA_KEY = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.:/@+-]{0,127}\Z")
MAX_VALUE_BYTES = 64 << 10
MAX_KEYS = 1000
MAX_METADATA_BYTES = 1 << 20  # the whole map, keys and values: it travels in every app row


def now_iso() -> str:
    return datetime.now(UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


class AppExists(Exception):
    pass


class AppNotFound(Exception):
    pass


class MetadataRefused(Refused):
    """A metadata patch that breaks a limit."""


def check_metadata_patch(set_: dict[str, str], delete: Sequence[str] = ()) -> None:
    """Refuse bad keys and oversized values before anything is read or written, and any change
    of the app's private network (it is chosen when the app is created)."""
    if NETWORK_KEY in set_ or NETWORK_KEY in delete:
        raise MetadataRefused(
            "invalid", f"{NETWORK_KEY}: an app's private network is set when it is created"
        )
    for key, value in set_.items():
        if not METADATA_KEY.match(key):
            raise MetadataRefused(
                "invalid",
                f"set: bad metadata key {key[:140]!r}: 1 to 128 letters, digits or _.:/@+-,"
                " not starting with punctuation other than _",
            )
        if len(value.encode()) > MAX_VALUE_BYTES:
            raise MetadataRefused(
                "metadata_too_large",
                f"set: the value of {key!r} is over {MAX_VALUE_BYTES >> 10} KiB",
            )


def check_metadata(metadata: dict[str, str]) -> None:
    """Refuse a map, once patched, that is over the registry's limits."""
    if len(metadata) > MAX_KEYS:
        raise MetadataRefused(
            "metadata_too_large", f"an app keeps at most {MAX_KEYS} metadata keys"
        )
    size = sum(len(k.encode()) + len(v.encode()) for k, v in metadata.items())
    if size > MAX_METADATA_BYTES:
        raise MetadataRefused(
            "metadata_too_large",
            f"an app's metadata is at most {MAX_METADATA_BYTES >> 20} MiB in all; delete old"
            " keys in the same patch",
        )


# The registry's migrations (souk.schema). Version 1 is the schema as it stood when versions
# began, columns of earlier releases added where missing; a change is a step appended here.
REGISTRY_SCHEMA = Schema(
    "app registry",
    (
        together(
            "CREATE TABLE IF NOT EXISTS apps (name TEXT PRIMARY KEY, org TEXT NOT NULL,"
            " created_at TEXT NOT NULL, deleted INTEGER NOT NULL DEFAULT 0, seq INTEGER NOT NULL,"
            " metadata TEXT NOT NULL DEFAULT '{}', secrets TEXT NOT NULL DEFAULT '{}',"
            " secrets_version INTEGER NOT NULL DEFAULT 0);"
            "CREATE TABLE IF NOT EXISTS meta (key TEXT PRIMARY KEY, value TEXT NOT NULL);"
            "CREATE TABLE IF NOT EXISTS revocations (id TEXT PRIMARY KEY,"
            " revoked_at TEXT NOT NULL, seq INTEGER NOT NULL);",
            add_missing_columns(
                "apps",
                {
                    "metadata": "TEXT NOT NULL DEFAULT '{}'",  # a registry from before app metadata
                    "secrets": "TEXT NOT NULL DEFAULT '{}'",  # ... or before app secrets
                    "secrets_version": "INTEGER NOT NULL DEFAULT 0",
                },
            ),
        ),
    ),
)


class AppRegistry:
    """Durable app rows with a monotonically increasing sequence per change."""

    owner = REGISTRY_OWNER  # as a catalog `RowSource`: apps rows, in the global region
    region = GLOBAL_REGION

    def __init__(self, path: Path | None = None) -> None:
        if path is not None:  # every app's metadata, secrets and revocations: 0600
            private_database(path)
        self._db = sqlite3.connect(
            str(path) if path else ":memory:", isolation_level=None, check_same_thread=False
        )
        self._db.row_factory = sqlite3.Row
        self._lock = threading.Lock()
        self._db.execute("PRAGMA journal_mode=WAL")
        migrate(self._db, REGISTRY_SCHEMA, path)
        epoch = f"{time.time_ns():016x}-{secrets.token_hex(4)}"  # ordered, as a worker's
        self._db.execute("INSERT OR IGNORE INTO meta VALUES ('epoch', ?)", (epoch,))
        self.epoch: str = self._db.execute("SELECT value FROM meta WHERE key='epoch'").fetchone()[0]
        self.listeners: list[Callable[[int, list[Change]], None]] = []
        # Every request checks it: held in memory, and only ever grows.
        self._revoked = {r[0] for r in self._db.execute("SELECT id FROM revocations")}
        # Every create reads its app: held in memory too, replaced at each change (`_publish`,
        # which every write ends with: this object is the apps' one writer).
        self._apps = {r["name"]: self._row(r) for r in self._db.execute("SELECT * FROM apps")}

    def head(self) -> int:
        return int(
            self._db.execute(
                "SELECT MAX((SELECT COALESCE(MAX(seq), 0) FROM apps),"
                " (SELECT COALESCE(MAX(seq), 0) FROM revocations))"
            ).fetchone()[0]
        )

    def changes_since(self, since: int, limit: int) -> tuple[list[Change], int, bool]:
        apps = self._db.execute(
            "SELECT * FROM apps WHERE seq > ? ORDER BY seq LIMIT ?", (since, limit + 1)
        ).fetchall()
        revoked = self._db.execute(
            "SELECT * FROM revocations WHERE seq > ? ORDER BY seq LIMIT ?", (since, limit + 1)
        ).fetchall()
        both = sorted(
            [*map(self._change, apps), *map(self._revocation_change, revoked)],
            key=lambda c: c.seq,
        )
        changes = both[:limit]
        if len(both) > limit:
            return changes, changes[-1].seq, True
        return changes, self.head(), False

    def apps(self) -> list[str]:
        return []  # the app-to-regions index comes from workers

    def get(self, name: str, include_deleted: bool = False) -> AppRow | None:
        """The app's row, as held in memory: callers read it, never change it."""
        row = self._apps.get(name)
        if row is None or (row.deleted and not include_deleted):
            return None
        return row

    def list(self) -> list[AppRow]:
        rows = self._db.execute("SELECT * FROM apps WHERE deleted = 0 ORDER BY name").fetchall()
        return [self._row(r) for r in rows]

    def create(self, name: str, org: str = "personal", network: str | None = None) -> AppRow:
        """Create, or recreate a deleted name; an app that exists is refused. `network`: the
        private network it shares with its org's apps created with the same (None: the org's
        default), kept in its metadata where no patch reaches it."""
        metadata = json.dumps({NETWORK_KEY: network} if network else {})
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT deleted FROM apps WHERE name = ?", (name,)).fetchone()
            if row is not None and not row["deleted"]:
                raise AppExists(name)
            seq = self.head() + 1
            self._db.execute(
                "INSERT OR REPLACE INTO apps (name, org, created_at, deleted, seq, metadata,"
                " secrets, secrets_version) VALUES (?, ?, ?, 0, ?, ?, '{}', 0)",
                (name, org, now_iso(), seq, metadata),
            )
        return self._publish(name)

    def delete(self, name: str) -> bool:
        """Mark deleted (a tombstone replicas apply like any change); False if there was none."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT deleted FROM apps WHERE name = ?", (name,)).fetchone()
            if row is None or row["deleted"]:
                return False
            self._db.execute(
                "UPDATE apps SET deleted = 1, metadata = '{}', secrets = '{}', seq = ?"
                " WHERE name = ?",
                (self.head() + 1, name),
            )
        self._publish(name)
        return True

    def metadata(self, name: str) -> dict[str, str]:
        row = self.get(name)
        if row is None:
            raise AppNotFound(name)
        return dict(row.metadata)

    def patch_metadata(
        self, name: str, set_: dict[str, str], delete: Sequence[str]
    ) -> dict[str, str]:
        """Delete, then set, in one transaction; returns the app's metadata after the patch.
        Refused whole (MetadataRefused) when it breaks a limit."""
        check_metadata_patch(set_, delete)
        with self._lock, self._db:
            row = self._live(name)
            before: dict[str, str] = json.loads(row["metadata"])
            gone = frozenset(delete)
            after = {k: v for k, v in before.items() if k not in gone}
            after.update(set_)
            if after == before:
                return after
            check_metadata(after)
            self._db.execute(
                "UPDATE apps SET metadata = ?, seq = ? WHERE name = ?",
                (json.dumps(after, sort_keys=True), self.head() + 1, name),
            )
        self._publish(name)
        return after

    # --- secrets ---------------------------------------------------------------------------

    def patch_secrets(
        self, name: str, set_: dict[str, SecretRecord], delete: Sequence[str]
    ) -> AppRow:
        """Delete, then set, sealed secrets in one transaction; every patch that changes
        something is a new `secrets_version`. Returns the app as it is after the patch.
        A secret set again keeps its `created_at`."""
        with self._lock, self._db:
            row = self._live(name)
            before: dict[str, dict[str, str]] = json.loads(row["secrets"])
            after = {k: v for k, v in before.items() if k not in frozenset(delete)}
            for key, record in set_.items():
                created = before.get(key, {}).get("created_at", record.created_at)
                after[key] = record.model_copy(update={"created_at": created}).model_dump()
            if after == before:
                return self._row(row)
            if len(after) > MAX_SECRETS:
                raise MetadataRefused(
                    "too_many_secrets", f"an app keeps at most {MAX_SECRETS} secrets"
                )
            self._db.execute(
                "UPDATE apps SET secrets = ?, secrets_version = ?, seq = ? WHERE name = ?",
                (
                    json.dumps(after, sort_keys=True),
                    int(row["secrets_version"]) + 1,
                    self.head() + 1,
                    name,
                ),
            )
        return self._publish(name)

    def _live(self, name: str) -> sqlite3.Row:
        """The app's row, read in a write transaction begun here (so no other writer changes
        it before this one commits); AppNotFound if there is none or it is deleted."""
        self._db.execute("BEGIN IMMEDIATE")
        row: sqlite3.Row | None = self._db.execute(
            "SELECT * FROM apps WHERE name = ?", (name,)
        ).fetchone()
        if row is None or row["deleted"]:
            raise AppNotFound(name)
        return row

    # --- revoked tokens -----------------------------------------------------------------

    def revoke(self, token_id: str) -> RevocationRow:
        """Revoke a token id (and so every token attenuated from it); idempotent."""
        with self._lock, self._db:
            self._db.execute("BEGIN IMMEDIATE")
            row = self._db.execute("SELECT * FROM revocations WHERE id = ?", (token_id,)).fetchone()
            if row is not None:
                return self._revocation(row)
            self._db.execute(
                "INSERT INTO revocations (id, revoked_at, seq) VALUES (?, ?, ?)",
                (token_id, now_iso(), self.head() + 1),
            )
        self._revoked.add(token_id)
        row = self._db.execute("SELECT * FROM revocations WHERE id = ?", (token_id,)).fetchone()
        change = self._revocation_change(row)
        for listener in self.listeners:
            listener(change.seq, [change])
        return self._revocation(row)

    def revoked(self, token_id: str) -> bool:
        return token_id in self._revoked

    def revocations(self) -> builtins.list[RevocationRow]:
        rows = self._db.execute("SELECT * FROM revocations ORDER BY seq").fetchall()
        return [self._revocation(r) for r in rows]

    @staticmethod
    def _revocation(row: sqlite3.Row) -> RevocationRow:
        return RevocationRow(id=row["id"], revoked_at=row["revoked_at"])

    def _revocation_change(self, row: sqlite3.Row) -> Change:
        revocation = self._revocation(row)
        return Change("revocations", revocation.id, int(row["seq"]), revocation.model_dump())

    def close(self) -> None:
        self._db.close()

    def _publish(self, name: str) -> AppRow:
        with self._lock:  # read and held in one step: a write's row never replaces a later one
            row = self._db.execute("SELECT * FROM apps WHERE name = ?", (name,)).fetchone()
            app = self._apps[name] = self._row(row)
        change = self._change(row)
        for listener in self.listeners:
            listener(change.seq, [change])
        return app

    @staticmethod
    def _row(row: sqlite3.Row) -> AppRow:
        return AppRow(
            name=row["name"],
            org=row["org"],
            created_at=row["created_at"],
            deleted=bool(row["deleted"]),
            metadata=json.loads(row["metadata"]),
            secrets=json.loads(row["secrets"]),
            secrets_version=row["secrets_version"],
        )

    def _change(self, row: sqlite3.Row) -> Change:
        app = self._row(row)
        return Change("apps", app.name, int(row["seq"]), app.model_dump(mode="json"))
