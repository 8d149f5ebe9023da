"""A fleet across network namespaces: placement, a clustered bus that loses a server, a worker
whose link is cut, a link that flaps."""

from __future__ import annotations

import time
from typing import Any

import pytest

from tests.fleet.parts import Fleet, eventually

pytestmark = pytest.mark.integration

UNREACHABLE_AFTER = 3.0  # the broker's replica calls a worker silent this long unreachable


def ok(answer: tuple[int, Any]) -> tuple[int, Any] | None:
    """The answer if it is a 200, for `eventually`."""
    return answer if answer[0] == 200 else None


def test_the_broker_places_on_both_workers_and_lists_them(fleet: Fleet, app: str) -> None:
    broker = fleet.broker
    made: dict[str, str] = {}
    for _ in range(6):
        status, body = broker.create(app, query="policy=spread")
        assert status == 200, body
        assert body["region"] == "mad"
        made[body["id"]] = body["worker"]
    assert set(made.values()) == {"w1", "w2"}
    assert broker.listed(app) == set(made)
    for worker in fleet.workers:
        held = {m["id"] for m in worker.machines() if m["app"] == app}
        assert held == {mid for mid, w in made.items() if w == worker.host}
    eventually(fleet.converged, what="the broker's replica holds every machine")


@pytest.mark.parametrize("lost", [0, 1, 2], ids=["nats1", "nats2", "nats3"])
def test_losing_any_one_nats_server_changes_nothing(fleet: Fleet, app: str, lost: int) -> None:
    """Once the parts that were on the lost server are back on the bus (a heartbeat of every
    worker has reached the broker since): the instant before is
    test_partitions.py::test_a_create_while_the_workers_reconnect_to_the_bus_succeeds."""
    broker = fleet.broker
    moment = time.monotonic()
    fleet.nats[lost].kill()
    fleet.heard_since(moment)
    made = []
    for _ in range(4):
        status, body = broker.create(app)
        assert status == 200, body
        made.append(body["id"])
    eventually(lambda: broker.listed(app) == set(made), what="the broker lists every machine")
    # Changes made on a worker directly reach the broker only through the catalog.
    status, direct = fleet.workers[0].api(
        "POST", "/v1/machines", {"app": app, "config": {"init": {"exec": ["sleep", "600"]}}}
    )
    assert status == 201, direct
    eventually(
        lambda: direct["id"] in broker.listed(app), what="a worker's own create reaches the broker"
    )
    eventually(fleet.converged, what="the broker's replica converges")
    assert all(broker.reachable().values())


def test_a_worker_cut_from_everyone_is_unreachable_then_placeable_again(
    fleet: Fleet, app: str
) -> None:
    broker = fleet.broker
    fleet.bed.link_down("w1")
    eventually(lambda: not broker.reachable()["w1"], 10, "the broker calls w1 unreachable")
    assert broker.reachable()["w2"]
    for _ in range(3):
        status, body = broker.create(app)
        assert status == 200, body
        assert body["worker"] == "w2"
    status, body = broker.create(app, avoid_workers=["w2"])
    assert status == 412, body
    assert body["code"] == "insufficient_capacity"
    assert {"worker": "w1", "reason": "unreachable"} in body["details"]["refusals"]

    fleet.bed.link_up("w1")
    eventually(lambda: broker.reachable()["w1"], 30, "w1 heard from again")
    # A heartbeat heard proves w1 -> broker only; offers go the other way, which resumes when
    # that end's TCP retransmission timer fires: placeable again within a bounded wait.
    status, body = eventually(
        lambda: ok(broker.create(app, avoid_workers=["w2"])), 30, "a create placed on w1"
    )
    assert body["worker"] == "w1"
    eventually(fleet.converged, what="the broker's replica converges")


def test_a_flapping_link_ends_converged_with_nothing_orphaned(fleet: Fleet, app: str) -> None:
    """Creates while w1's link goes down and up: each gets an answer, and once the link stays
    up, the broker's picture is the workers' and every machine on them is one a client was
    told about."""
    broker = fleet.broker
    flap = fleet.bed.flap("w1", down_for=1.5, up_for=1.0)
    told: set[str] = set()
    answers: list[int] = []
    try:
        end = time.monotonic() + 2 * UNREACHABLE_AFTER
        while time.monotonic() < end:
            time.sleep(0.25)
            status, body = broker.create(app, timeout=15)
            answers.append(status)
            if status == 200:
                told.add(body["id"])
            else:
                assert status in (412, 503), body
    finally:
        flap.stop()
    assert flap.flips >= 2
    assert told, f"no create succeeded: {answers}"
    eventually(lambda: all(broker.reachable().values()), 30, "every worker heard from again")
    eventually(fleet.converged, 20, "the broker's replica converges")
    held = {
        m["id"]
        for w in fleet.workers
        for m in w.machines()
        if m["app"] == app and m["state"] != "destroyed"
    }
    assert held == told
    assert broker.listed(app) == told
