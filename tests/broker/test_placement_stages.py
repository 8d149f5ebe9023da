"""The stages of placement that need no I/O, one by one: candidates, feasible, offer rounds,
ranked, picked."""

from __future__ import annotations

import random
import time

import pytest
from hypothesis import given
from hypothesis import strategies as st

from souk.broker.fleet import StaticFleet
from souk.broker.placement import pipeline
from souk.broker.placement.candidates import Candidate, CandidateCache
from souk.broker.placement.pipeline import Placer
from souk.broker.placement.stages import (
    AVOIDED,
    Refusals,
    Scores,
    candidates,
    feasible,
    offer_rounds,
    picked,
    rank,
    with_cached_image,
)
from souk.broker.registry import AppRegistry
from souk.clients.workers import WorkerClient
from souk.models.api import Refusal
from souk.models.catalog import WorkerRow
from souk.models.machine import CpuKind, GuestConfig
from tests.broker.placement_data import SMALL, row, worker

REGION = [row(f"w{i}") for i in range(10)]


def ids(rows: list[WorkerRow]) -> list[str]:
    return [r.id for r in rows]


def test_offer_strategies_take_the_whole_region_as_one_slice() -> None:
    for strategy in ("offers", "p2c"):
        assert list(candidates(REGION, strategy, 3, random.Random(1))) == [REGION]


def test_the_catalog_takes_slices_from_a_random_start_and_sees_every_row_once() -> None:
    starts = set()
    for seed in range(20):
        slices = list(candidates(REGION, "catalog", 3, random.Random(seed)))
        assert [len(s) for s in slices] == [3, 3, 3, 1]
        seen = [r.id for s in slices for r in s]
        assert sorted(seen) == sorted(ids(REGION))
        start = ids(REGION).index(seen[0])
        assert seen == ids(REGION[start:] + REGION[:start])  # the region's order, rotated
        starts.add(start)
    assert len(starts) > 1


def test_the_workers_holding_the_image_join_the_first_slice_and_only_it() -> None:
    holding = [REGION[8], REGION[2]]  # wherever they are in the region
    slices = list(candidates(REGION, "catalog", 3, random.Random(1), 0, holding))
    assert ids(slices[0]) == ["w8", "w2", "w0", "w1"]  # the holders, then the slice's others
    assert [ids(s) for s in slices[1:]] == [["w3", "w4", "w5"], ["w6", "w7"], ["w9"]]
    assert sorted(r.id for s in slices for r in s) == sorted(ids(REGION))  # each once
    assert list(candidates([], "catalog", 3, random.Random(1))) == []


def test_feasible_keeps_the_workers_that_fit_and_says_why_not_for_each_other() -> None:
    rows = [
        row("ok"),
        row("cordoned", cordoned=True),
        row("draining", draining=True),
        row("perf", cpu_kinds=["performance"]),
        row("full", memory_mb_reserved=4000),
        row("avoided"),
    ]
    fit = feasible(rows, SMALL, frozenset({"avoided"}), CandidateCache())
    assert ids(fit.rows) == [c.worker for c in fit.candidates] == ["ok"]
    assert [(r.worker, r.reason) for r in fit.refusals] == [
        ("cordoned", "cordoned"),
        ("draining", "draining"),
        ("perf", "no shared cpus"),
        ("full", "not enough room: free 4 cpus, 96 MB"),
        ("avoided", AVOIDED),
    ]


def test_a_slices_refusals_read_later_say_what_the_stage_saw_in_the_order_found() -> None:
    """Refusals are built when read, not when found: read after the rows changed (the worker
    freed, uncordoned), they still say why each was out when the create looked."""
    cache = CandidateCache()
    full, cordoned = row("full", memory_mb_reserved=4000), row("cordoned", cordoned=True)
    fit = feasible(
        [full, cordoned, row("ok"), row("avoided")], SMALL, frozenset({"avoided"}), cache
    )
    feasible([row("full"), row("cordoned")], SMALL, frozenset(), cache)  # the next versions
    refusals = Refusals()
    refusals.append(Refusal(worker="first", reason="timeout"))
    refusals.add(fit.refusals)
    refusals.append(Refusal(worker="ok", reason="refused at reservation"))
    refusals.prepend([Refusal(worker="gone", reason="unreachable")])
    assert len(refusals) == 6
    assert [(r.worker, r.reason) for r in refusals] == [
        ("gone", "unreachable"),
        ("first", "timeout"),
        ("full", "not enough room: free 4 cpus, 96 MB"),
        ("cordoned", "cordoned"),
        ("avoided", AVOIDED),
        ("ok", "refused at reservation"),
    ]
    assert [r.worker for r in fit.refusals] == ["full", "cordoned", "avoided"]
    assert fit.refusals[1] == Refusal(worker="cordoned", reason="cordoned")


KINDS: st.SearchStrategy[CpuKind] = st.sampled_from(["shared", "performance"])


@given(
    st.lists(
        st.builds(
            row,
            st.sampled_from(["a", "b", "c", "d"]),
            cpu_kinds=st.lists(KINDS, unique=True, max_size=2),
            cpus_reserved=st.integers(0, 6),
            memory_mb_reserved=st.integers(0, 5000),
            cordoned=st.booleans(),
            draining=st.booleans(),
        ),
        max_size=6,
    ),
    st.builds(GuestConfig, cpu_kind=KINDS, cpus=st.integers(1, 6), memory_mb=st.integers(16, 5000)),
    st.frozensets(st.sampled_from(["a", "b"])),
)
def test_feasible_tells_what_fits_by_the_workers_rule(
    rows: list[WorkerRow], guest: GuestConfig, avoid: frozenset[str]
) -> None:
    """`feasible` tells the rows that fit apart inline before asking `misfit` why the others do
    not: its answer for every row is still the rule's, reason and all."""
    fit = feasible(rows, guest, avoid, CandidateCache())
    expected: list[str] = []
    refusals: list[tuple[str, str]] = []
    for r in rows:
        why = Candidate.from_row(r).misfit(guest, cordoned=r.cordoned, draining=r.draining)
        if why is not None:
            refusals.append((r.id, why.reason))
        elif r.id in avoid:
            refusals.append((r.id, AVOIDED))
        else:
            expected.append(r.id)
    assert ids(fit.rows) == [c.worker for c in fit.candidates] == expected
    assert [(r.worker, r.reason) for r in fit.refusals] == refusals


def test_the_catalog_starts_its_slices_where_it_is_told() -> None:
    for start in (3, 13):  # taken around the region's ring
        slices = list(candidates(REGION, "catalog", 4, random.Random(1), start))
        assert ids(slices[0]) == ids(REGION[3:7]) and [len(s) for s in slices] == [4, 4, 2]


def test_a_placer_keeps_its_slice_for_a_while_then_draws_another(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(pipeline, "STICKY_FOR", 0.05)
    placer = Placer(StaticFleet([], AppRegistry()), WorkerClient(), rng=random.Random(7))
    first = placer.slice_start("mad", 10_000)
    assert [placer.slice_start("mad", 10_000) for _ in range(3)] == [first] * 3
    assert placer.slice_start("ams", 10_000) != first  # each region its own
    time.sleep(0.06)
    assert placer.slice_start("mad", 10_000) != first


async def test_the_placer_sees_each_new_version_of_a_row_and_says_why_a_worker_is_out() -> None:
    w1, w2 = row("w1"), row("w2")
    placer = Placer(StaticFleet([], AppRegistry()), WorkerClient())
    rows, cands, refusals = placer.eligible([w1, w2], SMALL, avoid=frozenset({"w2"}))
    assert [c.worker for c in cands] == [r.id for r in rows] == ["w1"]
    assert [(r.worker, r.reason) for r in refusals] == [
        ("w2", "avoided by the request (avoid_workers)")
    ]
    full = w1.model_copy(update={"cpus_reserved": 4})  # the owner's next version of the row
    cordoned = w2.model_copy(update={"cordoned": True})
    rows, cands, refusals = placer.eligible([full, cordoned], SMALL)
    assert (rows, cands) == ([], [])
    assert [r.reason for r in refusals] == ["not enough room: free 0 cpus, 4096 MB", "cordoned"]


def test_offers_asks_everyone_at_once_and_p2c_two_at_random() -> None:
    assert list(offer_rounds(REGION, "offers", random.Random(1))) == [REGION]
    assert list(offer_rounds([], "offers", random.Random(1))) == []
    rounds = list(offer_rounds(REGION, "p2c", random.Random(1)))
    assert [len(r) for r in rounds] == [2] * 5
    assert sorted(r.id for batch in rounds for r in batch) == sorted(ids(REGION))
    firsts = {ids(next(offer_rounds(REGION, "p2c", random.Random(s))))[0] for s in range(20)}
    assert len(firsts) > 1


def test_the_catalog_marks_the_workers_that_cache_the_image() -> None:
    cands = [worker("a", 4, 4096), worker("b", 4, 4096)]
    marked = with_cached_image(cands, {"b", "elsewhere"})
    assert [c.image_cached for c in marked] == [False, True]
    assert with_cached_image(cands, set()) is cands


def test_ties_are_broken_at_random_not_by_input_order() -> None:
    cands = [worker(f"w{i}", 4, 4096) for i in range(4)]
    firsts = {rank(cands, SMALL, rng=random.Random(seed))[0][1].worker for seed in range(40)}
    assert len(firsts) > 1


def test_a_seeded_rank_replays_exactly() -> None:
    cands = [worker(f"w{i}", 4, 4096) for i in range(6)]
    once = [c.worker for _, c in rank(cands, SMALL, rng=random.Random(3))]
    assert once == [c.worker for _, c in rank(cands, SMALL, rng=random.Random(3))]


@given(
    changes=st.lists(
        st.tuples(st.integers(0, 7), st.integers(0, 8), st.sampled_from([256, 1024, 4096])),
        min_size=1,
        max_size=30,
    ),
    seed=st.integers(0, 1000),
)
def test_kept_scores_rank_as_scoring_afresh(changes: list[tuple[int, int, int]], seed: int) -> None:
    """Creates of mixed sizes while workers fill: each worker replaced by a new candidate as it
    changes (as the candidate cache does), sometimes by an equal one. Ranking with kept scores
    gives the scores and order that scoring every candidate again gives, for every size."""
    cands = [worker(f"w{i}", 8, 8192) for i in range(8)]
    scores = Scores(limit=12)  # small: tables start again within a run
    for i, (which, cpus_used, memory_mb) in enumerate(changes):
        old = cands[which]
        cands[which] = worker(old.worker, 8 - cpus_used, 8192 - cpus_used * 1024)
        guest = GuestConfig(cpus=1, memory_mb=memory_mb)
        kept = rank(cands, guest, rng=random.Random(seed + i), scores=scores)
        afresh = rank(cands, guest, rng=random.Random(seed + i))
        assert [(s, c.worker) for s, c in kept] == [(s, c.worker) for s, c in afresh]


def test_picks_come_best_first_until_the_deadline() -> None:
    ranked = rank([worker("best", 3, 3072), worker("next", 8, 8192)], GuestConfig(memory_mb=1024))
    refusals: list[Refusal] = []
    picks = [(c.worker, left) for c, left in picked(ranked, time.monotonic() + 60, refusals)]
    assert [w for w, _ in picks] == ["best", "next"]
    assert all(0 < left <= 60 for _, left in picks) and refusals == []
    assert list(picked(ranked, time.monotonic() - 1, refusals)) == []
    assert [(r.worker, r.reason) for r in refusals] == [("best", "deadline passed")]
