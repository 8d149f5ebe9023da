"""Partitions: each test asserts what the fleet should do. A behaviour souk lacks gets a strict
xfail whose reason is what it does instead, so that the fix flips it (an unexpected pass fails
the run until the mark is removed); none is left today."""

from __future__ import annotations

from typing import Any

import pytest

from tests.fleet.parts import BrokerNode, Fleet, eventually

pytestmark = pytest.mark.integration

UNREACHABLE_AFTER = 3.0  # the broker's replica calls a worker silent this long unreachable


def silent(broker: BrokerNode, workers: list[str]) -> bool:
    """The broker's replica has heard nothing from these workers for longer than
    UNREACHABLE_AFTER: what it makes of that is the behaviour under test."""
    status, body = broker.api("GET", "/v1/catalog/status")
    assert status == 200, body
    quiet = {
        o["owner"]
        for o in body["owners"]
        if o["silent_for"] is not None and o["silent_for"] > UNREACHABLE_AFTER + 0.5
    }
    return set(workers) <= quiet


def place_on(fleet: Fleet, app: str, worker: str) -> str:
    """A machine placed through the broker on this worker (the others avoided), started."""
    others = [w.host for w in fleet.workers if w.host != worker]
    status, body = fleet.broker.create(app, avoid_workers=others)
    assert status == 200, body
    status, waited = fleet.worker(worker).api(
        "GET", f"/v1/machines/{body['id']}/wait?state=started&timeout=10"
    )
    assert status == 200, waited
    return str(body["id"])


def w1_the_fuller(fleet: Fleet, app: str) -> list[str]:
    """Two machines on w1 and one on w2, seen so by the broker's replica: w1 ranks first when
    packing (under load the replica can be a batch behind the workers' answers)."""
    placed = [place_on(fleet, app, w) for w in ("w1", "w1", "w2")]
    rows = fleet.broker.catalog_rows
    eventually(lambda: all(rows().get(m, ("", ""))[1] == "started" for m in placed), 15, "seen")
    return placed


def one_on_each(fleet: Fleet, app: str) -> dict[str, str]:
    """worker -> the id of a machine placed on it through the broker."""
    return {w.host: place_on(fleet, app, w.host) for w in fleet.workers}


def creates(broker: BrokerNode, app: str, n: int, query: str = "") -> list[tuple[int, Any]]:
    return [broker.create(app, timeout=30, query=query) for _ in range(n)]


def statuses(answers: list[tuple[int, Any]]) -> list[Any]:
    """Each answer's status, with the refusals of a 412: what the assertion shows on failure."""
    return [
        (s, [r["reason"] for r in b.get("details", {}).get("refusals", [])]) if s != 200 else s
        for s, b in answers
    ]


# --- the broker's own bus link ----------------------------------------------------------------


def test_placement_keeps_working_while_the_brokers_bus_link_is_down(fleet: Fleet, app: str) -> None:
    broker = fleet.broker
    fleet.bed.drop("b1", [n.host for n in fleet.nats])
    eventually(lambda: silent(broker, ["w1", "w2"]), 10, "the broker's replica hears nothing")
    answers = creates(broker, app, 3)
    assert [s for s, _ in answers] == [200] * 3, statuses(answers)
    assert broker.listed(app) == {b["id"] for _, b in answers}


# --- a region cut from the bus ----------------------------------------------------------------


def test_machines_of_a_region_cut_from_the_bus_stay_reachable(fleet: Fleet, app: str) -> None:
    """Every worker of mad loses the bus, not the broker: the broker still finds, lists and
    drives their machines over HTTP, from the rows it holds."""
    broker = fleet.broker
    placed = one_on_each(fleet, app)
    fleet.bed.drop(["w1", "w2"], [n.host for n in fleet.nats])
    eventually(lambda: silent(broker, ["w1", "w2"]), 10, "the region is silent on the bus")
    assert not any(broker.reachable().values())
    for mid in placed.values():
        status, body = broker.api("GET", f"/v1/apps/{app}/machines/{mid}")
        assert status == 200, body
        assert body["state"] == "started"
    assert broker.listed(app) == set(placed.values())
    status, body = broker.api("POST", f"/v1/apps/{app}/machines/{placed['w1']}/stop")
    assert status == 200, body
    held = fleet.worker("w1").api("GET", f"/v1/machines/{placed['w1']}/wait?state=stopped")
    assert held[0] == 200, held


def test_placement_in_a_region_cut_from_the_bus_keeps_working(fleet: Fleet, app: str) -> None:
    broker = fleet.broker
    fleet.bed.drop(["w1", "w2"], [n.host for n in fleet.nats])
    eventually(lambda: silent(broker, ["w1", "w2"]), 10, "the region is silent on the bus")
    answers = creates(broker, app, 3)
    assert [s for s, _ in answers] == [200] * 3, statuses(answers)


def test_a_create_while_the_workers_reconnect_to_the_bus_succeeds(fleet: Fleet, app: str) -> None:
    """Losing the server both workers are on, while their way to the others is slow: held back
    here (packets dropped) for the length of one create, so that the outcome does not depend
    on which of the two reconnects first."""
    lost, kept, spare = fleet.nats
    fleet.arrange({"w1": lost, "w2": lost, "b1": kept})
    with fleet.bed.dropping(["w1", "w2"], [kept.host, spare.host]):
        lost.kill()
        status, body = fleet.broker.create(app, timeout=30)
    assert status == 200, statuses([(status, body)])


# --- a broker cut from one worker -------------------------------------------------------------


def test_a_broker_cut_from_one_worker_says_so_for_its_machines(fleet: Fleet, app: str) -> None:
    """Both still on the bus, so the catalog calls w1 reachable; the broker's calls to it fail
    with a clear 503, not a hang."""
    placed = one_on_each(fleet, app)
    with fleet.bed.dropping("b1", "w1"):
        status, body = fleet.broker.api("GET", f"/v1/apps/{app}/machines/{placed['w1']}", None, 30)
        assert status == 503, body
        assert body["code"] == "worker_unreachable"
        status, body = fleet.broker.api("GET", f"/v1/apps/{app}/machines/{placed['w2']}")
        assert status == 200, body
        assert fleet.broker.reachable() == {"w1": True, "w2": True}


def test_a_broker_cut_from_one_worker_places_on_the_other(fleet: Fleet, app: str) -> None:
    w1_the_fuller(fleet, app)
    with fleet.bed.dropping("b1", "w1"):
        answers = creates(fleet.broker, app, 3, "policy=binpack")
    assert [s for s, _ in answers] == [200] * 3, statuses(answers)
    assert {b["worker"] for _, b in answers} == {"w2"}


# --- an asymmetric link -----------------------------------------------------------------------


def test_an_asymmetric_link_leaves_placement_working_and_nothing_orphaned(
    fleet: Fleet, app: str
) -> None:
    """w1 hears the broker, the broker does not hear w1 (one direction dropped): a create sent
    to w1 happens there unseen. Creates must still succeed, and once the link heals every
    machine on the workers must be one a client was told about."""
    broker = fleet.broker
    # the broker's connections to w1 are pooled, so its requests do arrive
    placed = w1_the_fuller(fleet, app)
    with fleet.bed.dropping("w1", "b1", one_way=True):
        answers = creates(broker, app, 3, "policy=binpack")
    told = set(placed) | {b["id"] for s, b in answers if s == 200}

    def held(include_deleted: bool = False) -> set[str]:
        return {
            m["id"]
            for w in fleet.workers
            for m in w.machines(include_deleted)
            if m["app"] == app and (include_deleted or m["state"] != "destroyed")
        }

    unseen = held(include_deleted=True) - told
    eventually(lambda: held() == told, 40, "no machine left that nobody was told about")
    assert [s for s, _ in answers] == [200] * 3, statuses(answers)
    if not unseen:
        # Placement worked and nothing is orphaned, but the case this test is for did not occur:
        # the broker sent w1 no create (under load it can judge w1 by its silence first).
        workers = sorted(b["worker"] for _, b in answers)
        pytest.skip(f"no create reached w1 unseen this run; placed on {workers}")
