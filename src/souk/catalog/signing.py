"""What an owner signs, so that any replica, and any replica a row is relayed to later, can tell
that the owner wrote it.

An owner signs each message once: a statement of the message's header (owner, region, epoch,
prev, head, ...) and the root of a hash tree over its rows. A replica checks that one signature
and keeps, with each row version, the header, the signature and the row's path in the tree: the
proof it relays in a snapshot, which its recipient checks against the owner's key again. So a
replica can relay rows but never forge, reorder into another epoch or move between owners. A
single-row batch (the usual one) has an empty path: its proof is the header and signature.

Heartbeats are signed too, but a replica checks the signature only when a beat brings news (a new
epoch, apps, a head it has not applied, a new chain); otherwise it checks the beat's tick: the
next element of a hash chain, one step back towards the element of the last beat it accepted.
Only the owner knows the chain's next element before it shows it, so a tick proves the owner is
alive for the cost of a hash, where a signature check costs about a hundred times more, a
thousand times a second at a thousand owners.
"""

from __future__ import annotations

import binascii
import hashlib
import os
import time
from collections.abc import Sequence
from typing import Any, NamedTuple, Protocol

import nacl.exceptions
import nacl.signing
import orjson

from souk.catalog.protocol import Change, Heartbeat

DOMAIN = "souk.catalog/1"  # every statement starts with it: no other signed thing reads as one
DIGEST = 32
EMPTY_ROOT = bytes(DIGEST)
CHAIN_LENGTH = 256  # beats per tick chain: a replica checks a signature once per chain


class Signer(Protocol):
    """An owner's private key and the CA-signed certificate that names it (DER)."""

    @property
    def certificate(self) -> bytes: ...

    @property
    def fingerprint(self) -> str: ...

    def sign(self, data: bytes) -> bytes: ...


class Verifier(Protocol):
    def verify(self, signature: bytes, data: bytes) -> bool: ...


class Ed25519Verifier:
    """A public key, checked with libsodium (PyNaCl): twice as fast as OpenSSL's Ed25519 here,
    and a replica checks a signature for every batch it applies."""

    def __init__(self, raw: bytes) -> None:
        self.key = nacl.signing.VerifyKey(raw)

    def verify(self, signature: bytes, data: bytes) -> bool:
        try:
            self.key.verify(data, signature)
        except (nacl.exceptions.BadSignatureError, ValueError, TypeError):
            return False
        return True


class Ed25519Signer:
    """A `Signer` over a raw Ed25519 private key (32-byte seed) and its certificate."""

    def __init__(self, seed: bytes, certificate: bytes) -> None:
        self._key = nacl.signing.SigningKey(seed)
        self._cert = certificate
        self._fp = fingerprint(certificate)

    @property
    def certificate(self) -> bytes:
        return self._cert

    @property
    def fingerprint(self) -> str:
        return self._fp

    def sign(self, data: bytes) -> bytes:
        return bytes(self._key.sign(data).signature)


def fingerprint(certificate: bytes) -> str:
    """Which certificate signed a message: 128 bits of its SHA-256, in hex."""
    return hashlib.sha256(certificate).hexdigest()[:32]


def b64(data: bytes) -> str:
    return binascii.b2a_base64(data, newline=False).decode()


def unb64(text: str) -> bytes:
    """Raises ValueError on anything that is not base64 (as `base64.b64decode(validate=True)`,
    without its wrapping, which cost as much as the decoding: it runs for every message)."""
    return binascii.a2b_base64(text, strict_mode=True)


# --- rows and the hash tree ------------------------------------------------------------------


def row_text(row: dict[str, Any] | None) -> bytes:
    """A row's canonical bytes: what is hashed, and what a replica stores."""
    return orjson.dumps(row, option=orjson.OPT_SORT_KEYS)


# Hashes with their one-byte prefix already taken: a copy of one costs less than making one,
# and a replica hashes a leaf for every row it applies signed.
_LEAF = hashlib.blake2b(b"\x00", digest_size=DIGEST)
_NODE = hashlib.blake2b(b"\x01", digest_size=DIGEST)


def leaf(table: str, key: str, seq: int, text: bytes) -> bytes:
    """H(0x00 || [table, key, seq] || 0x00 || text)."""
    h = _LEAF.copy()
    h.update(orjson.dumps([table, key, seq]))  # in parts: no copy of the row's text made
    h.update(b"\x00")
    h.update(text)
    return h.digest()


def _node(left: bytes, right: bytes) -> bytes:
    """H(0x01 || left || right)."""
    h = _NODE.copy()
    h.update(left + right)
    return h.digest()


def tree(leaves: Sequence[bytes]) -> tuple[bytes, list[list[bytes]]]:
    """The root over `leaves`, and each leaf's path to it (the sibling at each level; a node
    without a sibling moves up as it is)."""
    if not leaves:
        return EMPTY_ROOT, []
    paths: list[list[bytes]] = [[] for _ in leaves]
    level = list(leaves)
    width = 1  # leaves under each node of this level
    while len(level) > 1:
        up = []
        for i in range(0, len(level), 2):
            if i + 1 < len(level):
                for j in range(i * width, min((i + 1) * width, len(leaves))):
                    paths[j].append(level[i + 1])
                for j in range((i + 1) * width, min((i + 2) * width, len(leaves))):
                    paths[j].append(level[i])
                up.append(_node(level[i], level[i + 1]))
            else:
                up.append(level[i])
        level = up
        width *= 2
    return level[0], paths


def root_from_path(leaf_hash: bytes, index: int, count: int, path: Sequence[bytes]) -> bytes | None:
    """The root a leaf and its path lead to, or None if the path does not fit the tree's shape."""
    if not 0 <= index < count:
        return None
    h, pos, width, used = leaf_hash, index, count, 0
    while width > 1:
        sibling = pos ^ 1
        if sibling < width:
            if used >= len(path):
                return None
            other = path[used]
            used += 1
            h = _node(h, other) if pos % 2 == 0 else _node(other, h)
        pos //= 2
        width = (width + 1) // 2
    return h if used == len(path) else None


# --- signed headers and the proofs a replica keeps --------------------------------------------

_SIGNED_PART = 9  # the fields both proofs begin with (`proof_part`)


class Header(NamedTuple):
    """What an owner signs for a batch (`kind` "batch") or a pull reply ("pull"; `prev` is the
    pull's `since`), its fields in the order they are signed. A tuple: one is made for every
    message a replica checks."""

    kind: str
    owner: str
    region: str
    epoch: str
    prev: int
    head: int
    more: bool
    size: int  # how many rows
    root: str  # the hash tree's root, base64: as it is signed and relayed
    fp: str

    def statement(self) -> bytes:
        return orjson.dumps([DOMAIN, *self])

    def signed(self, sig: str, texts: list[bytes], paths: list[list[bytes]]) -> Signed:
        """What a replica keeps of the message this header is of, signed with `sig`."""
        part = proof_part(
            self.kind,
            self.region,
            self.epoch,
            self.prev,
            self.head,
            self.more,
            self.size,
            self.fp,
            sig,
        )
        return Signed(part, self.root, texts, paths)


def proof_part(
    kind: str,
    region: str,
    epoch: str,
    prev: int,
    head: int,
    more: bool,
    size: int,
    fp: str,
    sig: str,
) -> str:
    """What a row's proof and a head's begin with, as stored and relayed (JSON, the list left
    open): the header without its owner (a proof is kept with the owner's rows) and its root (a
    row's proof leads to it), then the signature."""
    return orjson.dumps([kind, region, epoch, prev, head, more, size, fp, sig])[:-1].decode()


class Signed(NamedTuple):
    """A signed message as a replica keeps it, to relay its rows and head: made once per batch
    (checked, or on the authenticated bus only signed), taken apart by nothing but its proofs."""

    part: str  # `proof_part`: what both proofs begin with
    root: str  # the hash tree's root, base64, as signed
    texts: list[bytes]  # each change's canonical row text
    paths: list[list[bytes]]

    def row_proof(self, index: int) -> str:
        """What proves a row to a replica it is relayed to, with the row itself: the signed
        part, then the row's place and path."""
        path = self.paths[index]
        if not path:  # a single-row batch, the usual one
            return f"{self.part},{index},[]]"
        return f"{self.part},{index},{orjson.dumps([b64(p) for p in path]).decode()}]"

    def head_proof(self) -> str:
        """What proves the owner's head to a replica this is relayed to: the signed part, then
        the root."""
        return f'{self.part},"{self.root}"]'  # base64: nothing in it for JSON to escape


def rows_tree(changes: Sequence[Change]) -> tuple[list[bytes], str, list[list[bytes]]]:
    """The changes' row texts, the root of the hash tree over them (base64, as signed), and
    each row's path to it."""
    if len(changes) == 1:  # most batches: the tree is its one leaf
        c = changes[0]
        text = row_text(c.row)
        return [text], b64(leaf(c.table, c.key, c.seq, text)), [[]]
    texts = [row_text(c.row) for c in changes]
    leaves = [leaf(c.table, c.key, c.seq, text) for c, text in zip(changes, texts, strict=True)]
    root, paths = tree(leaves)
    return texts, b64(root), paths


def header_for(
    kind: str,
    owner: str,
    region: str,
    epoch: str,
    prev: int,
    head: int,
    more: bool,
    changes: Sequence[Change],
    fp: str,
) -> tuple[Header, list[bytes], list[list[bytes]]]:
    """The header an owner signs for these changes, with their row texts and paths."""
    texts, root, paths = rows_tree(changes)
    return Header(kind, owner, region, epoch, prev, head, more, len(texts), root, fp), texts, paths


def _from_signed_part(owner: str, part: Sequence[Any], root: str) -> tuple[Header, bytes]:
    kind, region, epoch, prev, head, more, count, fp, sig = part
    header = Header(
        str(kind),
        owner,
        str(region),
        str(epoch),
        int(prev),
        int(head),
        bool(more),
        int(count),
        root,
        str(fp),
    )
    return header, unb64(str(sig))


def _proof_fields(proof: Any, extra: int, what: str) -> list[Any]:
    if not isinstance(proof, list) or len(proof) != _SIGNED_PART + extra:
        raise ValueError(f"malformed {what}: not a list of {_SIGNED_PART + extra}")
    return proof


def row_proof_header(
    owner: str, table: str, key: str, seq: int, text: bytes, proof: Any
) -> tuple[Header, bytes]:
    """The header a stored row proof stands for, and its signature; ValueError if malformed."""
    fields = _proof_fields(proof, 2, "row proof")
    try:
        count, index, path = fields[6], fields[_SIGNED_PART], fields[_SIGNED_PART + 1]
        hashes = [unb64(p) for p in path]
        root = root_from_path(leaf(table, key, seq, text), int(index), int(count), hashes)
        if root is None:
            raise ValueError("the row's path does not lead to a root")
        return _from_signed_part(owner, fields[:_SIGNED_PART], b64(root))
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed row proof: {exc}") from None


def head_proof_header(owner: str, proof: Any) -> tuple[Header, bytes]:
    """The header a stored head proof stands for, and its signature; ValueError if malformed."""
    fields = _proof_fields(proof, 1, "head proof")
    try:
        root = str(fields[_SIGNED_PART])
        unb64(root)
        return _from_signed_part(owner, fields[:_SIGNED_PART], root)
    except (TypeError, ValueError) as exc:
        raise ValueError(f"malformed head proof: {exc}") from None


def beat_statement(b: Heartbeat) -> bytes:
    """What an owner signs for a heartbeat: all of it but the signature and certificate."""
    return orjson.dumps(
        [
            DOMAIN,
            "beat",
            b.owner,
            b.region,
            b.epoch,
            b.head,
            b.apps,
            b.fp,
            b.chain_at,
            b.n,
            b.tick,
        ]
    )


# --- the heartbeat tick chain ----------------------------------------------------------------


_STEP = hashlib.blake2b(b"\x03", digest_size=DIGEST)  # a chain step's hash, its prefix taken


def tick_step(x: bytes) -> bytes:
    """H(0x03 || x): a copy of the hash with its prefix already taken costs half of making one
    (a replica takes a step for every quiet heartbeat)."""
    h = _STEP.copy()
    h.update(x)
    return h.digest()


class TickChain:
    """The owner's side: x[n] for n = 1.. of a chain x[n-1] = H(x[n]) from a random seed x[L].
    Each beat shows the next element; a replica that accepted x[m] (signed, or by its tick)
    checks H^(n-m)(x[n]) = x[m]. A used-up chain is replaced by a new one, made later (`at`),
    whose first beat a replica checks by its signature."""

    def __init__(self, length: int = CHAIN_LENGTH) -> None:
        self.length = length
        self.at = 0
        self._new()

    def _new(self) -> None:
        x = os.urandom(DIGEST)
        elements = [x]
        for _ in range(self.length):
            x = tick_step(x)
            elements.append(x)
        elements.reverse()  # elements[n] hashes to elements[n - 1]
        self.elements = elements
        self.at = max(self.at + 1, time.time_ns() // 1_000_000)
        self.n = 0

    def next(self) -> tuple[int, int, str]:
        """(chain made at, n, x[n]) for the next beat."""
        if self.n >= self.length:
            self._new()
        self.n += 1
        return self.at, self.n, b64(self.elements[self.n])


def tick_follows(tick: bytes, steps: int, last: bytes) -> bool:
    """Whether `steps` hashes of `tick` lead to `last`, the element a replica holds."""
    x = tick
    for _ in range(steps):
        x = tick_step(x)
    return x == last
