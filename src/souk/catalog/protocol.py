"""The catalog's wire protocol, the same over NATS and the in-process bus.

Subjects (region-partitioned, so a replica can follow only the regions it needs):

- `souk.cat.ch.<region>`: an owner's committed batch of changes, published at once;
- `souk.cat.hb.<region>`: an owner's heartbeat (epoch, head, the apps it runs), every second;
  every replica follows heartbeats of all regions, which is what makes the global app index;
- `souk.cat.pull.<owner>`: request/reply, the owner's rows changed after a sequence;
- `souk.cat.snap`: request, answered in chunks by any replica: rows plus per-owner heads;
- `souk.cat.hello`: a replica that just started asks every owner to heartbeat now, so that it
  knows the fleet in milliseconds rather than at the next beat.

A batch says which head it follows (`prev`) and which it reaches (`head`), so a replica knows
whether it has everything up to `head` or must pull the gap.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import orjson

PREFIX = "souk.cat"
SNAPSHOT = f"{PREFIX}.snap"
HELLO = f"{PREFIX}.hello"
GLOBAL_REGION = "global"  # rows of no region (apps), followed by every replica
REGISTRY_OWNER = "app-registry"  # the one writer of apps rows
WILDCARD = "*"


def changes_subject(region: str) -> str:
    return f"{PREFIX}.ch.{region}"


def heartbeat_subject(region: str) -> str:
    return f"{PREFIX}.hb.{region}"


def pull_subject(owner: str) -> str:
    return f"{PREFIX}.pull.{owner}"


@dataclass(frozen=True)
class Change:
    """A row's new version (`row`) or its deletion (`row is None`) at owner sequence `seq`."""

    table: str
    key: str
    seq: int
    row: dict[str, Any] | None


@dataclass
class Batch:
    owner: str
    region: str
    epoch: str
    prev: int
    head: int
    changes: list[Change]


@dataclass
class Heartbeat:
    owner: str
    region: str
    epoch: str
    head: int
    apps: list[str] = field(default_factory=list)


@dataclass
class PullRequest:
    since: int
    limit: int = 2000


@dataclass
class PullReply:
    owner: str
    region: str
    epoch: str
    head: int  # everything up to here is in `changes` or older than `since`
    more: bool
    changes: list[Change]


@dataclass
class SnapshotChunk:
    replica: str
    index: int
    last: bool
    heads: dict[str, tuple[str, str, int]]  # owner -> (region, epoch, head), in the last chunk
    changes: list[tuple[str, Change]]  # (owner, change)


class ProtocolError(ValueError):
    """A message that is not what its subject promises; dropped and counted, never applied."""


def encode(message: Batch | Heartbeat | PullRequest | PullReply | SnapshotChunk) -> bytes:
    return orjson.dumps(message)  # dataclasses natively: `asdict` alone cost 60 µs a batch


def _changes(items: Any) -> list[Change]:
    if not isinstance(items, list):
        raise ProtocolError("changes must be a list")
    out = []
    for item in items:
        if not isinstance(item, dict) or not isinstance(item.get("seq"), int):
            raise ProtocolError(f"malformed change: {item!r:.200}")
        row = item.get("row")
        if row is not None and not isinstance(row, dict):
            raise ProtocolError("a change's row must be an object or null")
        out.append(Change(str(item.get("table")), str(item.get("key")), item["seq"], row))
    return out


def _load(data: bytes) -> dict[str, Any]:
    try:
        value = orjson.loads(data)
    except ValueError as exc:
        raise ProtocolError(f"not JSON: {exc}") from None
    if not isinstance(value, dict):
        raise ProtocolError("not an object")
    return value


def decode_batch(data: bytes) -> Batch:
    d = _load(data)
    try:
        return Batch(
            str(d["owner"]),
            str(d["region"]),
            str(d["epoch"]),
            int(d["prev"]),
            int(d["head"]),
            _changes(d["changes"]),
        )
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed batch: {exc}") from None


def decode_heartbeat(data: bytes) -> Heartbeat:
    d = _load(data)
    try:
        return Heartbeat(
            str(d["owner"]),
            str(d["region"]),
            str(d["epoch"]),
            int(d["head"]),
            [str(a) for a in d.get("apps", [])],
        )
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed heartbeat: {exc}") from None


def decode_pull_request(data: bytes) -> PullRequest:
    d = _load(data)
    try:
        return PullRequest(int(d["since"]), max(1, min(int(d.get("limit", 2000)), 10_000)))
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed pull: {exc}") from None


def decode_pull_reply(data: bytes) -> PullReply:
    d = _load(data)
    try:
        return PullReply(
            str(d["owner"]),
            str(d["region"]),
            str(d["epoch"]),
            int(d["head"]),
            bool(d["more"]),
            _changes(d["changes"]),
        )
    except (KeyError, TypeError) as exc:
        raise ProtocolError(f"malformed pull reply: {exc}") from None


def decode_snapshot_chunk(data: bytes) -> SnapshotChunk:
    d = _load(data)
    try:
        heads = {str(o): (str(r), str(e), int(h)) for o, (r, e, h) in d["heads"].items()}
        pairs = [(str(o), c) for o, c in d["changes"]]
        changes = list(zip([o for o, _ in pairs], _changes([c for _, c in pairs]), strict=True))
        return SnapshotChunk(str(d["replica"]), int(d["index"]), bool(d["last"]), heads, changes)
    except (KeyError, TypeError, ValueError) as exc:
        raise ProtocolError(f"malformed snapshot chunk: {exc}") from None
