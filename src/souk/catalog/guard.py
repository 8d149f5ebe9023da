"""What a replica checks before it applies anything, and what it refused, counted by reason.

Without a `Trust` (an insecure catalog: `souk dev`, unit tests) nothing is checked but subjects.
With one, every batch, pull reply, heartbeat and relayed row or head must carry a valid signature
by a key the CA certified for its owner; see `souk.catalog.signing` for what is signed.
"""

from __future__ import annotations

import logging
from binascii import a2b_base64
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from souk.catalog.protocol import Batch, Change, Heartbeat, PullReply
from souk.catalog.signing import (
    CHAIN_LENGTH,
    Header,
    Signed,
    Verifier,
    beat_statement,
    head_proof_header,
    proof_part,
    row_proof_header,
    rows_tree,
    tick_follows,
    tick_step,
    unb64,
)
from souk.catalog.trust import Refused, Trust

log = logging.getLogger("souk.catalog.guard")

# Why something was refused, as counted in a replica's status.
REASONS = (
    "wrong_subject",  # published under another owner's or region's subject
    "unsigned",  # no signature, where one is required
    "unknown_signer",  # signed with a certificate this replica does not know (yet: it asks)
    "bad_certificate",  # a certificate the CA did not issue, or expired
    "wrong_owner",  # signed by a certified node that may not write this owner's rows
    "bad_signature",  # the signature does not match
    "bad_proof",  # a relayed proof that does not fit its row, head or epoch
    "replayed",  # a heartbeat older than one already accepted
)
_CHECKED_KEEP = 20_000


@dataclass(slots=True)
class _Chain:
    """The last heartbeat accepted from an owner, with a checked signature or tick."""

    fp: str
    at: int
    n: int
    last: bytes
    epoch: str
    region: str
    apps: list[str]


class Guard:
    def __init__(
        self,
        trust: Trust | None,
        on_unknown: Callable[[str], None] = lambda owner: None,
        on_learnt: Callable[[str, bytes], None] = lambda fp, der: None,
    ) -> None:
        self.trust = trust
        self.on_unknown = on_unknown  # an owner signed with a certificate we lack: ask for it
        self.on_learnt = on_learnt  # a certificate checked out: keep it
        self.refused: Counter[str] = Counter()
        self._chains: dict[str, _Chain] = {}
        self._checked: dict[bytes, bytes] = {}  # signature -> statement, of relayed proofs

    @property
    def secure(self) -> bool:
        return self.trust is not None

    def refuse(self, exc: Refused, what: str) -> None:
        if not self.refused[exc.reason]:
            log.warning("refused %s: %s", what, exc)  # the first of each kind; then counted
        else:
            log.debug("refused %s: %s", what, exc)
        self.refused[exc.reason] += 1

    def learn(self, cert_b64: str) -> None:
        assert self.trust is not None
        try:
            der = unb64(cert_b64)
        except ValueError:
            raise Refused("bad_certificate", "not base64") from None
        fp = self.trust.learn(der)
        self.on_learnt(fp, der)

    def _key(self, owner: str, fp: str) -> Verifier:
        assert self.trust is not None
        if not fp:
            raise Refused("unsigned")
        verifier = self.trust.verifier(owner, fp)
        if verifier is None:
            self.on_unknown(owner)
            raise Refused("unknown_signer", f"certificate {fp} of {owner!r}")
        return verifier

    @staticmethod
    def _sig(sig: str) -> bytes:
        if not sig:
            raise Refused("unsigned")
        try:
            return unb64(sig)
        except ValueError:
            raise Refused("bad_signature", "not base64") from None

    def batch(self, batch: Batch, check: bool = True) -> Signed:
        """A batch, checked against its owner's key; raises Refused. `check=False` (a live
        batch on its owner's subject of an authenticated bus, not picked for an audit) skips
        the signature check alone: the batch must still be signed with a certificate that may
        sign its owner's rows, and its proofs are kept to relay, so whoever is handed them
        later checks them."""
        if check:
            return self._signed("batch", batch.owner, batch.prev, False, batch, batch.cert)
        # Most live batches on the authenticated bus: what `_signed` does but the check, and
        # no header made only to be taken apart (the proofs are the same bytes).
        if batch.cert:
            self._learn_on(batch.cert, "batch", batch.owner)
        self._key(batch.owner, batch.fp)
        self._sig(batch.sig)
        texts, root, paths = rows_tree(batch.changes)
        part = proof_part(
            "batch",
            batch.region,
            batch.epoch,
            batch.prev,
            batch.head,
            False,
            len(texts),
            batch.fp,
            batch.sig,
        )
        return Signed(part, root, texts, paths)

    def pull_reply(self, owner: str, reply: PullReply) -> Signed:
        """An answer to a pull from `owner`, checked against its key; raises Refused."""
        return self._signed("pull", owner, reply.since, reply.more, reply)

    def _signed(
        self,
        kind: str,
        owner: str,
        prev: int,
        more: bool,
        msg: Batch | PullReply,
        cert: str = "",
    ) -> Signed:
        if cert:
            self._learn_on(cert, kind, owner)
        key = self._key(owner, msg.fp)
        signature = self._sig(msg.sig)
        texts, root, paths = rows_tree(msg.changes)
        header = Header(
            kind, owner, msg.region, msg.epoch, prev, msg.head, more, len(texts), root, msg.fp
        )
        if not key.verify(signature, header.statement()):
            raise Refused("bad_signature", f"{kind} of {owner!r} up to {msg.head}")
        return header.signed(msg.sig, texts, paths)

    def _learn_on(self, cert: str, kind: str, owner: str) -> None:
        """The certificate a message came with, learnt; one that is not good is refused (and
        the message is checked against the certificates known)."""
        try:
            self.learn(cert)
        except Refused as exc:
            self.refuse(exc, f"the certificate on a {kind} of {owner!r}")

    def beat(self, beat: Heartbeat, applied: int | None) -> bool:
        """A heartbeat, accepted or Refused. `applied` is the head this replica holds for the
        beat's owner and epoch (None if none). A beat that brings no news (the epoch, region,
        apps and chain of the last beat checked) is checked by its tick alone: it proves the
        owner alive, and False is returned if it announces a head beyond `applied`, which counts
        only once `beat_signature` has checked it (when its batches have not closed the gap
        shortly after: a replica that lags hears of heads it has not applied in every beat)."""
        held = self._chains.get(beat.owner)
        if held is not None and applied is not None:
            # Every quiet beat comes this way (at 10,000 owners, 10,000 a second): field by
            # field, cheapest first, no tuples made, the tick decoded and hashed inline.
            steps = beat.n - held.n
            if (
                0 < steps <= CHAIN_LENGTH
                and beat.chain_at == held.at
                and beat.epoch == held.epoch
                and beat.fp == held.fp
                and beat.region == held.region
                and beat.apps == held.apps
            ):
                try:
                    tick = a2b_base64(beat.tick, strict_mode=True)
                except ValueError:
                    tick = b""
                last = held.last
                follows = tick_step(tick) == last if steps == 1 else tick_follows(tick, steps, last)
                if follows:
                    held.n = beat.n
                    held.last = tick
                    return beat.head <= applied
        if beat.cert:
            self._learn_on(beat.cert, "heartbeat", beat.owner)
        self.beat_signature(beat)
        if held is not None and (beat.chain_at, beat.n) <= (held.at, held.n):
            raise Refused("replayed", f"heartbeat {beat.n} of {beat.owner!r}")
        try:
            tick = unb64(beat.tick)
        except ValueError:
            raise Refused("bad_signature", "a tick that is not base64") from None
        self._chains[beat.owner] = _Chain(
            beat.fp, beat.chain_at, beat.n, tick, beat.epoch, beat.region, beat.apps
        )
        return True

    def beat_signature(self, beat: Heartbeat) -> None:
        key = self._key(beat.owner, beat.fp)
        if not key.verify(self._sig(beat.sig), beat_statement(beat)):
            raise Refused("bad_signature", f"heartbeat of {beat.owner!r}")

    def _check(self, owner: str, header: Header, sig: bytes) -> None:
        key = self._key(owner, header.fp)
        statement = header.statement()
        if self._checked.get(sig) == statement:
            return  # rows of one signed message share its signature: checked once
        if not key.verify(sig, statement):
            raise Refused("bad_signature", f"relayed proof of {owner!r}")
        if len(self._checked) >= _CHECKED_KEEP:
            self._checked.clear()
        self._checked[sig] = statement

    def relayed_row(
        self, owner: str, epoch: str, change: Change, text: bytes, proof: list[Any] | None
    ) -> None:
        """A row as another replica relayed it, with its owner's proof; raises Refused."""
        if proof is None:
            raise Refused("unsigned")
        try:
            header, sig = row_proof_header(owner, change.table, change.key, change.seq, text, proof)
        except ValueError as exc:
            raise Refused("bad_proof", str(exc)) from None
        if header.epoch != epoch:
            raise Refused("bad_proof", f"a row of {owner!r} signed in another epoch")
        self._check(owner, header, sig)

    def relayed_head(self, owner: str, region: str, epoch: str, head: int, proof: Any) -> None:
        """An owner's head as another replica relayed it; raises Refused."""
        if proof is None:
            raise Refused("unsigned")
        try:
            header, sig = head_proof_header(owner, proof)
        except ValueError as exc:
            raise Refused("bad_proof", str(exc)) from None
        if (header.region, header.epoch, header.head) != (region, epoch, head):
            raise Refused("bad_proof", f"the head claimed for {owner!r} is not the one signed")
        self._check(owner, header, sig)
