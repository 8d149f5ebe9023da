"""Candidates: one shape for a catalog row and an offer, the one fit rule, and the cache that
builds each row's candidate once per version of the row."""

from __future__ import annotations

from souk.broker.placement.candidates import Candidate, CandidateCache
from souk.models.capacity import Capacity, Resources
from souk.models.catalog import WorkerRow
from souk.models.machine import GuestConfig
from tests.broker.placement_data import SMALL, row, worker


def test_candidates_from_catalog_rows_and_offers_agree() -> None:
    row = WorkerRow(
        id="w1",
        region="mad",
        address="http://w1",
        cpu_kinds=["shared"],
        cpus_total=8,
        memory_mb_total=8192,
        cpus_reserved=3,
        memory_mb_reserved=1000,
        epoch="e",
    )
    cap = Capacity(
        worker="w1",
        region="mad",
        cpu_kinds=["shared"],
        total=Resources(cpus=8, memory_mb=8192),
        reserved=Resources(cpus=3, memory_mb=1000),
        free=Resources(cpus=5, memory_mb=7192),
        machines=2,
    )
    assert Candidate.from_row(row) == Candidate.from_capacity(cap, "http://w1")
    assert Candidate.from_row(row).fits(GuestConfig(cpus=5, memory_mb=7192))
    assert not Candidate.from_row(row).fits(GuestConfig(cpus=6, memory_mb=256))


def test_a_candidate_names_a_misfit_as_the_worker_does() -> None:
    cand = worker("w", 2, 1024)
    assert cand.misfit(SMALL) is None
    assert cand.misfit(SMALL, cordoned=True) is not None
    reasons = [
        cand.misfit(SMALL, cordoned=True),
        cand.misfit(SMALL, draining=True),
        cand.misfit(GuestConfig(cpu_kind="performance")),
        cand.misfit(GuestConfig(cpus=3)),
        cand.misfit(GuestConfig(memory_mb=2048)),
    ]
    assert [(m.kind, m.reason) for m in reasons if m is not None] == [
        ("cordoned", "cordoned"),
        ("draining", "draining"),
        ("cpu_kind", "no performance cpus"),
        ("room", "not enough room: free 2 cpus, 1024 MB"),
        ("room", "not enough room: free 2 cpus, 1024 MB"),
    ]


def test_the_cache_builds_a_candidate_once_per_version_of_a_row() -> None:
    cache = CandidateCache()
    first = row("w1")
    assert cache(first) is cache(first)
    assert cache(first) == Candidate.from_row(first)
    changed = first.model_copy(update={"cpus_reserved": 3})  # the owner's next version
    assert cache(changed).cpus_free == 1
    assert cache(changed) is cache(changed)
    assert len(cache) == 1


def test_the_cache_starts_over_when_full() -> None:
    cache = CandidateCache(limit=2)
    rows = [row(f"w{i}") for i in range(3)]
    held = [cache(r) for r in rows[:2]]
    assert len(cache) == 2
    cache(rows[2])
    assert len(cache) == 1
    assert cache(rows[0]) is not held[0] and cache(rows[0]) == held[0]


def test_the_cache_knows_the_address_of_each_worker_it_has_seen() -> None:
    cache = CandidateCache()
    assert cache.address("w1") is None
    cache(row("w1"))
    assert cache.address("w1") == "http://w1"
    cache(row("w1", address="http://moved"))  # the row's next version
    assert cache.address("w1") == "http://moved"
