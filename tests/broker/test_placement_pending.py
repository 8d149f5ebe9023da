"""What a broker is reserving on a worker, counted against its room when ranking: creates on
their way, and creates taken until a newer row of the worker shows them."""

from __future__ import annotations

import types

import pytest

from souk.broker.placement import pending
from souk.broker.placement.candidates import CandidateCache
from souk.broker.placement.pending import PendingRoom
from souk.models.machine import GuestConfig
from tests.broker.placement_data import SMALL, row, worker

THREE = GuestConfig(cpus=3, memory_mb=1024)


def room(cache: CandidateCache) -> PendingRoom:
    return PendingRoom(cache.row)


def test_a_create_on_its_way_ranks_its_worker_as_it_will_be() -> None:
    cache = CandidateCache()
    cands = [cache(row("w1")), cache(row("w2"))]  # 4 cpus free each
    p = room(cache)
    assert p.split(cands, SMALL, offered=False) == (cands, [])
    going = p.reserving("w1", THREE)
    first, later = p.split(cands, SMALL, offered=False)
    assert [(c.worker, c.cpus_free, c.memory_mb_free) for c in first] == [
        ("w1", 1, 4096 - 1024),
        ("w2", 4, 4096),
    ]
    assert later == []
    first, later = p.split(cands, GuestConfig(cpus=2), offered=False)  # no room once it lands
    assert [c.worker for c in first] == ["w2"] and later == [cands[0]]  # ranked last, not dropped
    p.ended(going, taken=False)  # refused: the room is the row's again
    assert p.split(cands, SMALL, offered=False) == (cands, []) and len(p) == 0


def test_a_create_taken_counts_until_a_newer_row_shows_it() -> None:
    cache = CandidateCache()
    seen = row("w1")
    cands = [cache(seen)]
    p = room(cache)
    p.ended(p.reserving("w1", THREE), taken=True)
    assert p.split(cands, SMALL, offered=False)[0][0].cpus_free == 1  # not in the catalog yet
    assert p.split(cands, SMALL, offered=True) == (cands, [])  # an offer has it already
    newer = seen.model_copy(update={"cpus_reserved": 3, "memory_mb_reserved": 1024})
    cands = [cache(newer)]
    assert p.split(cands, SMALL, offered=False) == (cands, [])  # shown: not counted twice
    assert len(p) == 0


def test_a_create_taken_stops_counting_after_a_while(monkeypatch: pytest.MonkeyPatch) -> None:
    """A worker whose rows stopped coming is not ranked as fuller than it is for long."""
    clock = [100.0]
    monkeypatch.setattr(pending, "time", types.SimpleNamespace(monotonic=lambda: clock[0]))
    cache = CandidateCache()
    cands = [cache(row("w1"))]
    p = room(cache)
    p.ended(p.reserving("w1", GuestConfig(cpus=2)), taken=True)
    clock[0] += pending.ANSWERED_COUNTS_FOR / 2
    assert p.split(cands, SMALL, offered=False)[0][0].cpus_free == 2
    clock[0] += pending.ANSWERED_COUNTS_FOR
    assert p.split(cands, SMALL, offered=False) == (cands, [])


def test_offered_candidates_count_only_the_creates_on_their_way() -> None:
    cache = CandidateCache()
    p = room(cache)
    offered = [worker("w1", 4, 4096), worker("w2", 4, 4096)]
    p.ended(p.reserving("w1", SMALL), taken=True)
    p.reserving("w1", GuestConfig(cpus=2, memory_mb=512))
    first, _ = p.split(offered, SMALL, offered=True)
    assert (first[0].cpus_free, first[0].memory_mb_free) == (2, 4096 - 512)
    assert first[1] is offered[1]
