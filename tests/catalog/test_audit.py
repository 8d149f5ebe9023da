"""Live batches on an authenticated bus: applied without their signature checked, the proofs
kept for whoever they are relayed to, a sample audited; a failed audit makes the owner's rows
suspect, and they are pulled again from the owner with every answer checked."""

from __future__ import annotations

import logging
from typing import Any

import orjson
import pytest

from souk.catalog.bus import InProcessBus, Message
from souk.catalog.metrics import watch_replica
from souk.catalog.owner import Owner
from souk.catalog.protocol import changes_subject
from souk.catalog.replica import Replica
from souk.catalog.sim import SimRows
from souk.web.metrics import Metrics
from tests.catalog.pki import Ca
from tests.support.catalog import converged, start_owner
from tests.support.waiting import eventually


async def _owner_with_a_machine(
    bus: InProcessBus, ca: Ca, replica: Replica
) -> tuple[SimRows, Owner, list[bytes]]:
    src = SimRows("w1", "mad")
    owner = await start_owner(bus, src, beat=60, signer=ca.node("worker", "w1").signer())
    sent: list[bytes] = []

    async def keep(msg: Message) -> None:
        sent.append(msg.data)

    await bus.subscribe(changes_subject("mad", "w1"), keep)
    src.machine("web", key="m1")
    await eventually(lambda: converged(replica, [src]) and bool(sent))
    return src, owner, sent


def _forged(genuine: bytes, app: str, invent: str) -> bytes:
    """The owner's last batch with its row changed, a row it never wrote added, and a head
    ahead of its own: published on the owner's subject, which the bus lets the owner (or the
    bus itself) do; its signature no longer fits."""
    batch: dict[str, Any] = orjson.loads(genuine)
    row = batch["changes"][0]
    row["row"]["app"] = app
    row["seq"] += 10
    batch["changes"].append({**row, "key": invent, "row": {**row["row"], "id": invent}})
    batch["prev"], batch["head"] = batch["head"], batch["head"] + 10
    return orjson.dumps(batch)


async def test_a_live_batch_on_an_authenticated_bus_is_applied_unchecked_and_relayed_checked() -> (
    None
):
    bus, ca = InProcessBus(authenticated=True), Ca()
    replica = Replica(bus, trust=ca.trust(), audit_rate=0.0)
    await replica.start(bootstrap=False)
    src, owner, sent = await _owner_with_a_machine(bus, ca, replica)
    await bus.publish(changes_subject("mad", "w1"), _forged(sent[-1], "stolen", "m9"))
    await eventually(lambda: replica.machine("m9") is not None)
    machine = replica.machine("m1")
    assert machine is not None and machine.app == "stolen"  # the bus vouched; not audited
    assert replica.guard.refused == {} and replica.stats["audit_failures"] == 0

    fresh = Replica(bus, trust=ca.trust())  # bootstraps from the replica above
    await fresh.start()
    assert fresh.stats["snapshots_loaded"] == 1
    assert fresh.guard.refused["bad_signature"] >= 1  # the forged rows' proofs do not hold
    await eventually(lambda: converged(fresh, [src]))  # pulled from the owner instead
    assert fresh.machine("m9") is None
    await owner.stop()
    await replica.stop()
    await fresh.stop()


@pytest.mark.parametrize("authenticated", [True, False])
async def test_a_forged_live_batch_fails_its_audit_and_the_owners_rows_are_pulled_again(
    authenticated: bool, caplog: pytest.LogCaptureFixture
) -> None:
    bus, ca = InProcessBus(authenticated=authenticated), Ca()
    replica = Replica(bus, trust=ca.trust(), audit_rate=0.0)
    metrics = Metrics("souk")
    watch_replica(metrics, replica)
    await replica.start(bootstrap=False)
    src, owner, sent = await _owner_with_a_machine(bus, ca, replica)
    genuine = sent[-1]
    await bus.publish(changes_subject("mad", "w1"), _forged(genuine, "stolen", "m9"))
    if authenticated:  # first, one that is not audited: applied
        await eventually(lambda: replica.machine("m9") is not None)
    replica.audit.rate = 1.0
    await bus.publish(changes_subject("mad", "w1"), _forged(genuine, "taken", "m8"))
    if not authenticated:  # nothing is vouched for: each refused, no audit, nothing pulled
        await eventually(lambda: replica.guard.refused["bad_signature"] == 2)
        assert replica.stats["audit_failures"] == 0 and replica.stats["repulled"] == 0
        assert converged(replica, [src]) and replica.machine("m9") is None
    else:
        await eventually(lambda: replica.stats["repulled"] == 1)
        assert replica.stats["audit_failures"] == 1 and replica.stats["audited"] == 1
        assert replica.guard.refused == {"bad_signature": 1}
        # the owner's word again: the row it wrote, the head it reached, no row it never wrote
        assert converged(replica, [src])
        assert replica.machine("m9") is None and replica.machine("m8") is None
        machine = replica.machine("m1")
        assert machine is not None and machine.app == "web"
        assert not replica.owners["w1"].suspect
        assert "souk_catalog_audit_failures_total 1.0" in metrics.render().decode()
        errors = [r.getMessage() for r in caplog.records if r.levelno == logging.ERROR]
        assert len(errors) == 1 and "w1" in errors[0]
    src.machine("web", key="m2")  # and the owner's next batches apply as before
    await eventually(lambda: converged(replica, [src]))
    await owner.stop()
    await replica.stop()


async def test_the_first_batch_of_an_owner_a_replica_holds_nothing_of_is_checked() -> None:
    bus, ca = InProcessBus(authenticated=True), Ca()
    first = Replica(bus, trust=ca.trust(), audit_rate=1.0)
    await first.start(bootstrap=False)
    _, owner, sent = await _owner_with_a_machine(bus, ca, first)
    audited = first.stats["audited"]
    replica = Replica(bus, trust=ca.trust(), audit_rate=0.0, name="late")
    await replica.start(bootstrap=False)
    await eventually(lambda: "w1" in replica.owners)  # heard, by its answer to the hello
    # the late replica holds nothing of w1's: its first batch is checked, a forged one refused
    await bus.publish(changes_subject("mad", "w1"), _forged(sent[-1], "stolen", "m9"))
    await eventually(lambda: replica.guard.refused["bad_signature"] == 1)
    assert replica.machine("m9") is None and first.stats["audited"] == audited + 1
    await owner.stop()
    await first.stop()
    await replica.stop()
