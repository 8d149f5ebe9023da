"""The catalog's wire protocol, the same over NATS and the in-process bus.

Subjects (region-partitioned, so a replica can follow only the regions it needs, and naming the
owner, so that the bus can let an owner publish under its own name only):

- `souk.cat.ch.<region>.<owner>`: an owner's committed batch of changes, published at once;
- `souk.cat.hb.<region>.<owner>`: an owner's heartbeat (epoch, head, the apps it runs), every
  second; every replica follows heartbeats of all regions, which is what makes the global app
  index;
- `souk.cat.pull.<owner>`: request/reply, the owner's rows changed after a sequence;
- `souk.cat.cert.<owner>`: request/reply, the certificate the owner signs with;
- `souk.cat.snap`: request, answered in chunks by any replica: rows plus per-owner heads;
- `souk.cat.hello`: a replica that just started asks every owner to heartbeat now, so that it
  knows the fleet in milliseconds rather than at the next beat.

A batch says which head it follows (`prev`) and which it reaches (`head`), so a replica knows
whether it has everything up to `head` or must pull the gap. On a secured catalog, batches, pull
replies and heartbeats carry their owner's signature (`fp`: which certificate, `sig`), and a
snapshot carries the owners' own proofs for every row and head (see `souk.catalog.signing`).
Every message carries its sender's protocol version (`v`); one more than a version away from the
receiver's is dropped and counted like any malformed message.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, TypeVar
from urllib.parse import unquote

import orjson

from souk.models.wire import PROTOCOL, protocol_accepted

PREFIX = "souk.cat"
SNAPSHOT = f"{PREFIX}.snap"
HELLO = f"{PREFIX}.hello"
GLOBAL_REGION = "global"  # rows of no region (apps), followed by every replica
REGISTRY_OWNER = "app-registry"  # the one writer of apps rows
WILDCARD = "*"
M = TypeVar("M")
_SAFE = frozenset("-_~:@+=abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789")


def token(name: str) -> str:
    """A name as one subject token: what NATS reads as a separator or a wildcard (and `%`) is
    percent-encoded, so every name has its own token and subject permissions can name it."""
    if name == WILDCARD or _SAFE.issuperset(name):
        return name
    return "".join(c if c in _SAFE else "".join(f"%{b:02X}" for b in c.encode()) for c in name)


def changes_subject(region: str, owner: str = WILDCARD) -> str:
    return f"{PREFIX}.ch.{token(region)}.{token(owner)}"


def heartbeat_subject(region: str, owner: str = WILDCARD) -> str:
    return f"{PREFIX}.hb.{token(region)}.{token(owner)}"


def reserve_subject(worker: str) -> str:
    """Where a broker sends a worker creates on the bus (`BusReservation`): only that worker
    subscribes there, and on the authenticated bus only brokers may publish there."""
    return f"souk.reserve.{token(worker)}"


def pull_subject(owner: str) -> str:
    return f"{PREFIX}.pull.{token(owner)}"


def cert_subject(owner: str) -> str:
    return f"{PREFIX}.cert.{token(owner)}"


def subject_names(subject: str) -> tuple[str, str] | None:
    """(region, owner) of a changes or heartbeat subject."""
    parts = subject.split(".")
    if len(parts) != 5:
        return None
    return unquote(parts[3]), unquote(parts[4])


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
    fp: str = ""  # the signing certificate's fingerprint, empty on an unsigned catalog
    sig: str = ""
    cert: str = ""  # the certificate, on the first batch after a start or a hello
    v: int = PROTOCOL  # the sender's protocol version (`souk.models.wire.PROTOCOL`)


@dataclass
class Heartbeat:
    owner: str
    region: str
    epoch: str
    head: int
    apps: list[str] = field(default_factory=list)
    fp: str = ""
    sig: str = ""
    chain_at: int = 0  # when the owner's tick chain was made, ms (see `signing.TickChain`)
    n: int = 0  # this beat's place in the chain
    tick: str = ""  # the chain's n-th element, which only the owner can know before it shows it
    cert: str = ""  # the certificate itself, on the first beat and on answers to a hello
    v: int = PROTOCOL  # the sender's protocol version (`souk.models.wire.PROTOCOL`)


@dataclass
class PullRequest:
    since: int
    limit: int = 2000
    v: int = PROTOCOL  # the sender's protocol version (`souk.models.wire.PROTOCOL`)


@dataclass
class PullReply:
    owner: str
    region: str
    epoch: str
    head: int  # everything up to here is in `changes` or older than `since`
    more: bool
    changes: list[Change]
    since: int = 0
    fp: str = ""
    sig: str = ""
    v: int = PROTOCOL  # the sender's protocol version (`souk.models.wire.PROTOCOL`)


@dataclass
class HeadClaim:
    """An owner's head as a snapshot relays it, with the owner's proof of it (`signing.Proof`
    as stored, None on an unsigned catalog)."""

    region: str
    epoch: str
    head: int
    proof: list[Any] | None = None


@dataclass
class SnapshotChunk:
    replica: str
    index: int
    last: bool
    heads: dict[str, HeadClaim]  # in the last chunk
    changes: list[tuple[str, Change, list[Any] | None]]  # (owner, change, the owner's proof)
    certs: dict[str, str] = field(default_factory=dict)  # fingerprint -> certificate, base64
    v: int = PROTOCOL  # the sender's protocol version (`souk.models.wire.PROTOCOL`)


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
    version = value.get("v", 0)  # none: a release from before versions were sent
    if not isinstance(version, int) or not protocol_accepted(version):
        raise ProtocolError(f"protocol {version!r}: this souk understands {PROTOCOL} +/- 1")
    return value


def _decoded(data: bytes, what: str, build: Callable[[dict[str, Any]], M]) -> M:
    """`build` over a message's fields: a field missing, or one that is not what it should be,
    makes the message malformed."""
    d = _load(data)
    try:
        return build(d)
    except (KeyError, TypeError, ValueError, AttributeError) as exc:
        raise ProtocolError(f"malformed {what}: {exc}") from None


def _sender(d: dict[str, Any]) -> tuple[str, str, str]:
    """Who sent an owner's message: its owner, region and epoch."""
    return str(d["owner"]), str(d["region"]), str(d["epoch"])


def _text(d: dict[str, Any], name: str) -> str:
    """An optional text field (a signature's, a certificate's), empty when absent."""
    return str(d.get(name) or "")


def decode_batch(data: bytes) -> Batch:
    return _decoded(
        data,
        "batch",
        lambda d: Batch(
            *_sender(d),
            int(d["prev"]),
            int(d["head"]),
            _changes(d["changes"]),
            _text(d, "fp"),
            _text(d, "sig"),
            _text(d, "cert"),
        ),
    )


def decode_heartbeat(data: bytes) -> Heartbeat:
    return _decoded(
        data,
        "heartbeat",
        lambda d: Heartbeat(
            *_sender(d),
            int(d["head"]),
            [str(a) for a in d.get("apps", [])],
            _text(d, "fp"),
            _text(d, "sig"),
            int(d.get("chain_at") or 0),
            int(d.get("n") or 0),
            _text(d, "tick"),
            _text(d, "cert"),
        ),
    )


def decode_pull_request(data: bytes) -> PullRequest:
    return _decoded(
        data,
        "pull",
        lambda d: PullRequest(int(d["since"]), max(1, min(int(d.get("limit", 2000)), 10_000))),
    )


def decode_pull_reply(data: bytes) -> PullReply:
    return _decoded(
        data,
        "pull reply",
        lambda d: PullReply(
            *_sender(d),
            int(d["head"]),
            bool(d["more"]),
            _changes(d["changes"]),
            int(d.get("since") or 0),
            _text(d, "fp"),
            _text(d, "sig"),
        ),
    )


def _proof(value: Any) -> list[Any] | None:
    if value is not None and not isinstance(value, list):
        raise ProtocolError("a proof must be a list or null")
    return value


def decode_snapshot_chunk(data: bytes) -> SnapshotChunk:
    return _decoded(data, "snapshot chunk", _snapshot_chunk)


def _snapshot_chunk(d: dict[str, Any]) -> SnapshotChunk:
    heads = {
        str(o): HeadClaim(str(h["region"]), str(h["epoch"]), int(h["head"]), _proof(h["proof"]))
        for o, h in d["heads"].items()
    }
    triples = [(str(o), c, _proof(p)) for o, c, p in d["changes"]]
    changes = _changes([c for _, c, _ in triples])
    certs = {str(k): str(v) for k, v in (d.get("certs") or {}).items()}
    return SnapshotChunk(
        str(d["replica"]),
        int(d["index"]),
        bool(d["last"]),
        heads,
        [(o, c, p) for (o, _, p), c in zip(triples, changes, strict=True)],
        certs,
    )
