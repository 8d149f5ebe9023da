"""A signed catalog on the in-process bus: owners sign, replicas check before applying, and
count what they refuse; forged heartbeats, batches, pull answers and snapshots change nothing."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any, TypeVar

import orjson
import pytest

from souk.catalog.bus import InProcessBus, Message
from souk.catalog.owner import Owner
from souk.catalog.protocol import (
    REGISTRY_OWNER,
    SNAPSHOT,
    Batch,
    Change,
    Heartbeat,
    PullReply,
    changes_subject,
    encode,
    heartbeat_subject,
    pull_subject,
)
from souk.catalog.replica import Replica
from souk.catalog.signing import (
    Signer,
    Verifier,
    b64,
    beat_statement,
    header_for,
)
from souk.catalog.sim import SimRows
from souk.catalog.trust import CaTrust
from souk.models.catalog import AppRow
from tests.catalog.pki import Ca
from tests.support.catalog import converged, start_owner
from tests.support.waiting import eventually

Sent = TypeVar("Sent", Batch, PullReply)


def signed(signer: Signer, msg: Sent) -> Sent:
    """`msg` signed as its owner signs a batch or a pull reply."""
    kind, prev, more = (
        ("batch", msg.prev, False) if isinstance(msg, Batch) else ("pull", msg.since, msg.more)
    )
    fp = signer.fingerprint
    header, _, _ = header_for(
        kind, msg.owner, msg.region, msg.epoch, prev, msg.head, more, msg.changes, fp
    )
    msg.fp, msg.sig = fp, b64(signer.sign(header.statement()))
    return msg


def signed_beat(signer: Signer, beat: Heartbeat, n: int = 1) -> Heartbeat:
    beat.fp, beat.chain_at, beat.n, beat.tick = signer.fingerprint, 1, n, b64(b"t" * 32)
    beat.sig = b64(signer.sign(beat_statement(beat)))
    beat.cert = b64(signer.certificate)
    return beat


async def secure_replica(bus: InProcessBus, ca: Ca, **kwargs: Any) -> Replica:
    replica = Replica(bus, trust=ca.trust(), **kwargs)
    await replica.start(bootstrap=False)
    return replica


async def stop(*things: Owner | Replica) -> None:
    for thing in things:
        await thing.stop()


async def test_signed_rows_apply_and_unsigned_ones_are_refused() -> None:
    bus, ca = InProcessBus(), Ca()
    replica = await secure_replica(bus, ca)
    good, plain = SimRows("w1", "mad"), SimRows("w2", "mad")
    owners = [
        await start_owner(bus, good, signer=ca.node("worker", "w1").signer()),
        await start_owner(bus, plain),  # an owner without a key
    ]
    good.machine("web")
    plain.machine("web")
    await eventually(lambda: converged(replica, [good]))
    await eventually(lambda: replica.guard.refused["unsigned"] >= 3)  # its batches and beats
    assert replica.worker("w2") is None and replica.head("w2") == 0
    assert {m.worker_id for m in replica.machines()} == {"w1"}
    status = replica.status()
    assert status["security"] == "signed" and set(status["refused"]) == {"unsigned"}
    await stop(*owners, replica)


async def test_a_forged_heartbeat_neither_retires_a_worker_nor_keeps_one_alive() -> None:
    """The attack: one heartbeat with an epoch from the far future used to make every replica
    drop the worker's rows and, from then on, its real messages as stale."""
    bus, ca = InProcessBus(), Ca()
    replica = await secure_replica(bus, ca)
    plain = Replica(bus)  # an insecure replica on the same bus, for contrast
    await plain.start(bootstrap=False)
    src = SimRows("mad1", "mad")
    owner = await start_owner(bus, src, signer=ca.node("worker", "mad1").signer())
    src.machine("web")
    await eventually(lambda: converged(replica, [src]) and converged(plain, [src]))
    future = "ffffffffffffffff-0"
    forged = {"owner": "mad1", "region": "mad", "epoch": future, "head": 0}
    await bus.publish(heartbeat_subject("mad", "mad1"), orjson.dumps(forged))
    rogue = ca.node("worker", "evil").signer()  # certified, but not as mad1
    stranger = Ca().node("worker", "mad1").signer()  # named mad1, by another CA
    for signer in (rogue, stranger):
        beat = signed_beat(signer, Heartbeat("mad1", "mad", future, 0), n=10**6)
        await bus.publish(heartbeat_subject("mad", "mad1"), encode(beat))
    await eventually(lambda: plain.owners["mad1"].epoch == future)  # the attack, unsigned
    await eventually(lambda: sum(replica.guard.refused.values()) >= 3)
    assert replica.owners["mad1"].epoch == "e1"
    assert [w.id for w in replica.placeable("mad")] == ["mad1"]
    refused = replica.guard.refused
    assert refused["unsigned"] == 1 and refused["wrong_owner"] == 1
    assert refused["bad_certificate"] == 1
    src.machine("web")  # the worker's real messages still count
    await eventually(lambda: converged(replica, [src]))
    await stop(owner, replica, plain)


async def test_a_replayed_heartbeat_is_refused_and_keeps_no_one_alive() -> None:
    bus, ca = InProcessBus(), Ca()
    replica = await secure_replica(bus, ca, unreachable_after=0.3)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src, signer=ca.node("worker", "w1").signer())
    beats: list[bytes] = []

    async def keep(msg: Message) -> None:
        beats.append(msg.data)

    sub = await bus.subscribe(heartbeat_subject("mad", "w1"), keep)
    await eventually(lambda: converged(replica, [src]) and len(beats) >= 3)
    await owner.stop()
    await sub.unsubscribe()
    for _ in range(12):  # every beat the owner ever sent, over and over, after it died
        for data in beats:
            await bus.publish(heartbeat_subject("mad", "w1"), data)
        await asyncio.sleep(0.05)
    assert not replica.reachable("w1")
    assert replica.guard.refused["replayed"] >= len(beats)
    await replica.stop()


class CountingTrust(CaTrust):
    """Counts the signatures a replica checks."""

    checks = 0

    def verifier(self, owner: str, fp: str) -> Verifier | None:
        inner = super().verifier(owner, fp)
        if inner is None:
            return None
        checked: Verifier = inner  # narrowed, for the class below
        trust = self

        class Counted:
            def verify(self, signature: bytes, data: bytes) -> bool:
                trust.checks += 1
                return checked.verify(signature, data)

        return Counted()


async def test_quiet_heartbeats_are_checked_by_their_tick_not_their_signature() -> None:
    bus, ca = InProcessBus(), Ca()
    trust = CountingTrust([ca.cert])
    replica = Replica(bus, trust=trust)
    await replica.start(bootstrap=False)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src, beat=0.01, signer=ca.node("worker", "w1").signer())
    assert owner.chain is not None
    await eventually(lambda: converged(replica, [src]))
    checks, first = trust.checks, owner.chain.n
    await eventually(lambda: owner.chain is not None and owner.chain.n >= first + 30)
    await asyncio.sleep(0.05)
    assert trust.checks - checks <= 2  # thirty beats or more, hardly a signature checked
    assert replica.reachable("w1") and replica.guard.refused == {}
    src.machine("web")  # news still goes through signatures
    await eventually(lambda: converged(replica, [src]))
    await stop(owner, replica)


async def test_a_forged_worker_row_never_reaches_placement() -> None:
    """The attack: a worker row for an unknown worker "evil", whose address a broker would then
    send machine configurations to."""
    bus, ca = InProcessBus(), Ca()
    replica = await secure_replica(bus, ca)
    row = SimRows("evil", "mad").worker_row(0).model_dump(mode="json")
    row["address"] = "http://attacker.invalid"
    batch = Batch("evil", "mad", "e1", 0, 1, [Change("workers", "evil", 1, row)])
    await bus.publish(changes_subject("mad", "evil"), encode(batch))  # unsigned
    for signer in (
        Ca().node("worker", "evil").signer(),  # a certificate of another CA
        ca.node("proxy", "evil").signer(),  # certified, but not as a worker
        ca.node("worker", "w1").signer(),  # certified worker w1, writing as evil
    ):
        beat = signed_beat(signer, Heartbeat("evil", "mad", "e1", 1))  # with its certificate
        seen = sum(replica.guard.refused.values())
        await bus.publish(heartbeat_subject("mad", "evil"), encode(beat))
        await eventually(lambda s=seen: sum(replica.guard.refused.values()) > s)  # type: ignore[misc]
        forged = signed(signer, Batch("evil", "mad", "e1", 0, 1, list(batch.changes)))
        await bus.publish(changes_subject("mad", "evil"), encode(forged))
    await eventually(lambda: sum(replica.guard.refused.values()) >= 8)
    assert replica.worker("evil") is None and replica.placeable("mad") == []
    assert "evil" not in replica.owners
    assert replica.guard.refused == {
        "unsigned": 1,
        "bad_certificate": 1,  # the other CA's, on its heartbeat
        "unknown_signer": 2,  # so its heartbeat and batch were signed by no one known
        "wrong_owner": 4,  # the proxy's and w1's heartbeats and batches
    }
    await replica.stop()


async def test_a_tampered_batch_is_refused_whole() -> None:
    bus, ca = InProcessBus(), Ca()
    replica = await secure_replica(bus, ca)
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src, beat=60, signer=ca.node("worker", "w1").signer())
    sent: list[bytes] = []

    async def keep(msg: Message) -> None:
        sent.append(msg.data)

    await bus.subscribe(changes_subject("mad", "w1"), keep)
    src.machine("web", key="m1")
    await eventually(lambda: converged(replica, [src]) and bool(sent))
    tampered = orjson.loads(sent[-1])
    tampered["changes"][0]["row"]["app"] = "stolen"
    tampered["changes"][0]["seq"] += 10  # newer than what the replica holds
    tampered["prev"], tampered["head"] = tampered["head"], tampered["head"] + 10
    wrong_subject = dict(tampered, owner="w2")
    await bus.publish(changes_subject("mad", "w1"), orjson.dumps(tampered))
    await bus.publish(changes_subject("mad", "w1"), orjson.dumps(wrong_subject))
    await eventually(lambda: sum(replica.guard.refused.values()) >= 2)
    machine = replica.machine("m1")
    assert machine is not None and machine.app == "web"
    assert replica.guard.refused == {"bad_signature": 1, "wrong_subject": 1}
    await stop(owner, replica)


# On an authenticated bus too: what did not come straight from its owner on its own subject is
# checked before it is applied, whatever the bus vouches for.
ON_ANY_BUS = pytest.mark.parametrize("authenticated", [False, True], ids=["open", "authenticated"])


@ON_ANY_BUS
async def test_forged_pull_answers_change_nothing(authenticated: bool) -> None:
    bus, ca = InProcessBus(authenticated=authenticated), Ca()
    replica = await secure_replica(bus, ca, pull_timeout=0.5)
    src, other = SimRows("w1", "mad"), SimRows("w2", "mad")
    w1_key, w2_key = ca.node("worker", "w1").signer(), ca.node("worker", "w2").signer()
    owner = await start_owner(bus, src, beat=60, signer=w1_key)
    second = await start_owner(bus, other, beat=60, signer=w2_key)
    src.machine("web", key="m1")
    await eventually(lambda: converged(replica, [src, other]))
    await owner._subs[0].unsubscribe()  # the owner stops answering pulls: a forger does
    bus.faults.down = True  # the batches are lost: the replica hears of them by heartbeat only
    real = src.machine("web", key="m1", state="stopped")
    src.machine("web", key="m2")
    await asyncio.sleep(0.05)
    bus.faults.down = False
    bad_row = {**(real.row or {}), "app": "stolen"}
    genuine = src.changes_since(replica.head("w1"), 100)
    forgeries = [
        PullReply(
            "w1", "mad", "e1", real.seq, False, [Change("machines", "m1", real.seq, bad_row)]
        ),
        signed(
            w2_key, PullReply("w1", "mad", "e1", real.seq, False, genuine[0], replica.head("w1"))
        ),
        signed(
            w1_key, PullReply("w1", "mad", "e1", genuine[1], False, genuine[0], replica.head("w1"))
        ),
    ]
    forgeries[2].changes = [Change("machines", "m1", real.seq, bad_row)]  # after signing
    answers = iter(forgeries)

    async def forger(msg: Message) -> None:
        reply = next(answers, None)
        if reply is not None and msg.reply:
            await bus.publish(msg.reply, encode(reply))

    await bus.subscribe(pull_subject("w1"), forger)
    for _ in range(3):
        before = replica.stats["pulls"]
        await owner.heartbeat()
        await eventually(lambda b=before: replica.stats["pulls"] > b)  # type: ignore[misc]
        await eventually(lambda: not replica.owners["w1"].pulling)
    machine = replica.machine("m1")
    assert machine is not None and machine.app == "web" and machine.state == "started"
    assert replica.machine("m2") is None
    refused = replica.guard.refused
    assert refused["unsigned"] == 1 and refused["wrong_owner"] == 1
    assert refused["bad_signature"] == 1
    owner._subs[0] = await bus.subscribe(pull_subject("w1"), owner._on_pull)
    await owner.heartbeat()
    await eventually(lambda: converged(replica, [src, other]))
    await stop(owner, second, replica)


async def _snapshot_of(bus: InProcessBus, replica: Replica) -> list[dict[str, Any]]:
    """What `replica` answers a snapshot request with, as JSON."""
    chunks: list[dict[str, Any]] = []

    async def keep(msg: Message) -> None:
        chunks.append(orjson.loads(msg.data))

    inbox = bus.new_inbox()
    sub = await bus.subscribe(inbox, keep)
    await bus.publish(SNAPSHOT, b'{"regions": null}', reply=inbox)
    await eventually(lambda: bool(chunks) and chunks[-1]["last"])
    await sub.unsubscribe()
    return chunks


async def test_a_relayed_snapshot_carries_the_owners_proofs(tmp_path: Path) -> None:
    bus, ca = InProcessBus(), Ca()
    first = Replica(bus, tmp_path / "first.db", trust=ca.trust())
    await first.start(bootstrap=False)
    sources = [SimRows(f"w{i}", "mad" if i % 2 else "ams") for i in range(3)]
    owners = [
        await start_owner(bus, s, beat=60, signer=ca.node("worker", s.owner).signer())
        for s in sources
    ]
    for s in sources:
        for _ in range(3):
            s.machine("web")
    await eventually(lambda: converged(first, sources))
    await first.stop()
    again = Replica(bus, tmp_path / "first.db", trust=ca.trust())  # restarted: from its file
    await again.start(bootstrap=False)
    fresh = Replica(bus, trust=ca.trust())
    await fresh.start()
    assert fresh.stats["snapshots_loaded"] == 1 and fresh.stats["pulls"] == 0
    assert converged(fresh, sources) and fresh.guard.refused == {}
    await stop(*owners, again, fresh)


@ON_ANY_BUS
async def test_a_forged_snapshot_is_refused_and_its_owners_pulled(authenticated: bool) -> None:
    bus, ca = InProcessBus(authenticated=authenticated), Ca()
    first = await secure_replica(bus, ca)
    sources = [SimRows("w1", "mad"), SimRows("w2", "mad")]
    owners = [
        await start_owner(bus, s, beat=0.05, signer=ca.node("worker", s.owner).signer())
        for s in sources
    ]
    for s in sources:
        s.machine("web", key=f"{s.owner}-a")
        s.machine("web", key=f"{s.owner}-b")
    await eventually(lambda: converged(first, sources))
    genuine = await _snapshot_of(bus, first)
    await first.stop()

    def tamper_row(chunks: list[dict[str, Any]]) -> None:
        for owner, change, _ in chunks[0]["changes"]:
            if owner == "w1" and change["table"] == "machines":
                change["row"]["app"] = "stolen"

    def inflate_head(chunks: list[dict[str, Any]]) -> None:
        for chunk in chunks:
            if "w1" in chunk["heads"]:
                chunk["heads"]["w1"]["head"] = 10_000

    def strip_proofs(chunks: list[dict[str, Any]]) -> None:
        for chunk in chunks:
            for item in chunk["changes"]:
                item[2] = None
            for claim in chunk["heads"].values():
                claim["proof"] = None

    def copy_rows(chunks: list[dict[str, Any]]) -> None:  # w1's rows as w2's too
        chunks[0]["changes"] += [
            ["w2", change, proof]
            for owner, change, proof in chunks[0]["changes"]
            if owner == "w1" and change["table"] == "machines"
        ]

    cases = [
        (tamper_row, {"bad_signature"}),
        (inflate_head, {"bad_proof"}),
        (strip_proofs, {"unsigned"}),
        (copy_rows, {"wrong_owner"}),  # signed by w1, not w2
    ]
    for tamper, reasons in cases:
        chunks = orjson.loads(orjson.dumps(genuine))
        tamper(chunks)

        async def forger(msg: Message, chunks: list[dict[str, Any]] = chunks) -> None:
            for chunk in chunks:
                await bus.publish(msg.reply or "", orjson.dumps(chunk))

        sub = await bus.subscribe(SNAPSHOT, forger)
        fresh = Replica(bus, trust=ca.trust())
        await fresh.start()
        await sub.unsubscribe()
        # (beats may come before the snapshot's certificates, and be refused as unknown)
        assert set(fresh.guard.refused) - {"unknown_signer"} == reasons, tamper.__name__
        assert all(m.app == "web" for m in fresh.machines()), tamper.__name__
        await eventually(lambda f=fresh: converged(f, sources))  # type: ignore[misc]
        assert all(m.app == "web" for m in fresh.machines())
        await fresh.stop()
    await stop(*owners)


async def test_a_certificate_learnt_late_is_asked_for() -> None:
    bus, ca = InProcessBus(), Ca()
    replica = await secure_replica(bus, ca)
    src = SimRows("w1", "mad")
    bus.faults.down = True  # the first beat and batch, the ones with the certificate, are lost
    owner = await start_owner(bus, src, signer=ca.node("worker", "w1").signer())
    src.machine("web")
    await asyncio.sleep(0.05)
    bus.faults.down = False
    src.machine("web")
    await eventually(lambda: converged(replica, [src]))
    assert replica.guard.refused["unknown_signer"] >= 1
    await stop(owner, replica)


async def test_the_app_registry_signs_as_a_broker() -> None:
    bus, ca = InProcessBus(), Ca()
    replica = await secure_replica(bus, ca)

    class Registry(SimRows):
        def __init__(self) -> None:
            super().__init__(REGISTRY_OWNER, "global")
            self.rows.clear()

    async def publish_app(role: str, name: str) -> Owner:
        reg = Registry()
        app = AppRow(name=f"shop-{role}", created_at="now").model_dump(mode="json")
        reg.put("apps", f"shop-{role}", app)
        return await start_owner(bus, reg, signer=ca.node(role, name).signer())

    owner = await publish_app("broker", "b1")  # a broker's certificate: the registry's
    await eventually(lambda: bool(replica.apps()))
    await owner.stop()
    owner = await publish_app("worker", REGISTRY_OWNER)  # a worker's, named like it
    await eventually(lambda: replica.guard.refused["wrong_owner"] > 0)
    await owner.stop()
    assert [a.name for a in replica.apps()] == ["shop-broker"]
    await replica.stop()


async def test_a_beat_with_a_good_tick_but_a_forged_head_starts_no_pull() -> None:
    bus, ca = InProcessBus(), Ca()
    replica = await secure_replica(bus, ca)
    src = SimRows("w1", "mad")
    signer = ca.node("worker", "w1").signer()
    owner = await start_owner(bus, src, beat=60, signer=signer)
    await eventually(lambda: converged(replica, [src]))
    assert owner.chain is not None
    at, n, tick = owner.chain.next()  # a tick the replica has not seen: say, a forger's copy
    forged = Heartbeat("w1", "mad", "e1", 10_000, src.apps(), signer.fingerprint, b64(b"x" * 64))
    forged.chain_at, forged.n, forged.tick = at, n, tick
    pulls = replica.stats["pulls"]
    await bus.publish(heartbeat_subject("mad", "w1"), encode(forged))
    await eventually(lambda: replica.guard.refused["bad_signature"] == 1)
    assert replica.owners["w1"].seen == src.seq and replica.stats["pulls"] == pulls
    await stop(owner, replica)


async def test_an_owner_that_wrote_nothing_yet_is_left_out_of_a_snapshot() -> None:
    """An app registry with no apps is known by its heartbeats only, at head 0, with no signed
    header to relay: a snapshot leaves it out rather than hand over a head its recipient must
    refuse (and count as unsigned); the recipient hears of it from the owner itself."""
    bus, ca = InProcessBus(), Ca()
    first = await secure_replica(bus, ca)
    worker = SimRows("w1", "mad")
    registry = SimRows(REGISTRY_OWNER, "global")
    registry.rows.clear()
    registry.seq = 0
    owners = [
        await start_owner(bus, worker, beat=60, signer=ca.node("worker", "w1").signer()),
        await start_owner(bus, registry, beat=60, signer=ca.node("broker", "b1").signer()),
    ]
    await eventually(lambda: converged(first, [worker]) and REGISTRY_OWNER in first.owners)
    fresh = Replica(bus, trust=ca.trust())
    await fresh.start()
    assert fresh.stats["snapshots_loaded"] == 1
    await eventually(lambda: REGISTRY_OWNER in fresh.owners)  # from its answer to hello
    assert converged(fresh, [worker]) and fresh.guard.refused == {}
    await stop(*owners, first, fresh)
