"""Placement ranking: curves, the named policies, the image bonus and custom policies."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from souk.broker.fleet import StaticFleet
from souk.broker.placement import (
    POLICIES,
    REFUSE,
    Candidate,
    Curve,
    curve_policy,
    policy_named,
    rank,
)
from souk.broker.placer import Placer
from souk.broker.registry import AppRegistry
from souk.clients.workers import WorkerClient
from souk.models.capacity import Capacity, Resources
from souk.models.catalog import WorkerRow
from souk.models.machine import GuestConfig

SMALL = GuestConfig(cpus=1, memory_mb=256)


def worker(
    name: str, cpus_free: int, mem_free: int, cached: bool = False, **kw: object
) -> Candidate:
    values: dict[str, object] = {
        "worker": name,
        "address": f"http://{name}",
        "cpu_kinds": ("shared",),
        "cpus_total": 8,
        "memory_mb_total": 8192,
        "cpus_free": cpus_free,
        "memory_mb_free": mem_free,
        "image_cached": cached,
    }
    values.update(kw)
    return Candidate(**values)  # type: ignore[arg-type]


def order(cands: list[Candidate], policy: str = "default", guest: GuestConfig = SMALL) -> list[str]:
    return [c.worker for _, c in rank(cands, guest, policy_named(policy))]


def test_curve_interpolates_between_points_and_is_flat_outside() -> None:
    curve = Curve([(0.2, 1.0), (0.6, 3.0), (1.0, 0.0)])
    assert curve(0.0) == 1.0
    assert curve(0.2) == 1.0
    assert curve(0.4) == pytest.approx(2.0)
    assert curve(0.6) == pytest.approx(3.0)
    assert curve(0.8) == pytest.approx(1.5)
    assert curve(1.0) == pytest.approx(0.0)
    assert curve(5.0) == 0.0


@given(
    st.lists(st.floats(-1, 2, allow_nan=False), min_size=1, max_size=6, unique=True),
    st.floats(-1, 3, allow_nan=False),
)
def test_curve_stays_within_its_points_range(xs: list[float], u: float) -> None:
    xs = sorted(xs)
    ys = [random.Random(i).uniform(-1, 1) for i in range(len(xs))]
    value = Curve(zip(xs, ys, strict=True))(u)
    assert min(ys) - 1e-9 <= value <= max(ys) + 1e-9


@pytest.mark.parametrize(
    "points", [[], [(0.5, 1.0), (0.5, 2.0)], [(0.6, 1.0), (0.2, 0.0)], [(0.0, float("nan"))]]
)
def test_bad_curves_are_rejected(points: list[tuple[float, float]]) -> None:
    with pytest.raises(ValueError):
        Curve(points)


def test_binpack_prefers_the_fullest_and_spread_the_emptiest() -> None:
    cands = [worker("empty", 8, 8192), worker("half", 4, 4096), worker("full-ish", 2, 2048)]
    assert order(cands, "binpack") == ["full-ish", "half", "empty"]
    assert order(cands, "spread") == ["empty", "half", "full-ish"]


def test_default_prefers_well_used_over_empty_and_over_hot() -> None:
    cands = [
        worker("empty", 8, 8192),
        worker("well-used", 3, 3072),  # 75% after placing one cpu / 1 GiB
        worker("hot", 1, 1024),  # 100% after placing
    ]
    guest = GuestConfig(cpus=1, memory_mb=1024)
    assert order(cands, "default", guest) == ["well-used", "empty", "hot"]


def test_workers_that_cannot_fit_are_never_ranked() -> None:
    cands = [
        worker("no-cpu", 0, 8192),
        worker("no-mem", 8, 100),
        worker("wrong-kind", 8, 8192, cpu_kinds=("performance",)),
        worker("ok", 8, 8192),
    ]
    for policy in POLICIES:
        assert order(cands, policy) == ["ok"]
    assert POLICIES["default"](cands[0], SMALL) == REFUSE


def test_a_cached_image_wins_a_tie_every_time() -> None:
    rng = random.Random(7)
    for _ in range(50):
        cands = [worker(f"w{i}", 4, 4096) for i in range(5)] + [worker("cached", 4, 4096, True)]
        rng.shuffle(cands)
        for policy in POLICIES:
            assert order(cands, policy)[0] == "cached"


def test_ties_are_broken_at_random_not_by_input_order() -> None:
    cands = [worker(f"w{i}", 4, 4096) for i in range(4)]
    firsts = {rank(cands, SMALL, rng=random.Random(seed))[0][1].worker for seed in range(40)}
    assert len(firsts) > 1


def test_weights_make_one_resource_decide() -> None:
    cands = [worker("cpu-busy", 1, 8000), worker("mem-busy", 7, 600)]
    cpu_only = curve_policy([(0, 0), (1, 1)], cpu_weight=1, memory_weight=0)
    mem_only = curve_policy([(0, 0), (1, 1)], cpu_weight=0, memory_weight=1)
    assert [c.worker for _, c in rank(cands, SMALL, cpu_only)] == ["cpu-busy", "mem-busy"]
    assert [c.worker for _, c in rank(cands, SMALL, mem_only)] == ["mem-busy", "cpu-busy"]
    with pytest.raises(ValueError):
        curve_policy([(0, 0)], cpu_weight=0, memory_weight=0)


def test_an_operator_policy_is_a_plain_function() -> None:
    def prefer_label_gpu_free(c: Candidate, guest: GuestConfig) -> float:
        if c.worker.startswith("avoid"):
            return REFUSE
        return float(c.cpus_free)

    cands = [worker("avoid-me", 8, 8192), worker("a", 3, 8192), worker("b", 6, 8192)]
    assert [c.worker for _, c in rank(cands, SMALL, prefer_label_gpu_free)] == ["b", "a"]


def test_unknown_policy_names_are_refused() -> None:
    with pytest.raises(ValueError, match="binpack"):
        policy_named("tetris")


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


async def test_the_placer_sees_each_new_version_of_a_row_and_says_why_a_worker_is_out() -> None:
    base = {
        "region": "mad",
        "address": "http://w",
        "cpu_kinds": ["shared"],
        "cpus_total": 4,
        "memory_mb_total": 4096,
        "cpus_reserved": 0,
        "memory_mb_reserved": 0,
        "epoch": "e",
    }
    w1, w2 = (WorkerRow.model_validate({**base, "id": i}) for i in ("w1", "w2"))
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
