"""Scoring candidates: curves, the named policies, the image bonus and custom policies."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from souk.broker.placement.candidates import Candidate
from souk.broker.placement.policies import (
    CURVES,
    POLICIES,
    REFUSE,
    Curve,
    curve_policy,
    policy_named,
)
from souk.broker.placement.stages import rank
from souk.models.machine import CpuKind, GuestConfig
from tests.broker.placement_data import SMALL, worker


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


KINDS: st.SearchStrategy[CpuKind] = st.sampled_from(["shared", "performance"])


@given(
    st.builds(
        Candidate,
        worker=st.just("w"),
        address=st.just("http://w"),
        cpu_kinds=st.lists(KINDS, unique=True, max_size=2).map(tuple),
        cpus_total=st.integers(1, 64),
        memory_mb_total=st.integers(16, 1 << 16),
        cpus_free=st.integers(-8, 64),
        memory_mb_free=st.integers(-4096, 1 << 16),
        image_cached=st.booleans(),
    ),
    st.builds(
        GuestConfig,
        cpu_kind=KINDS,
        cpus=st.integers(1, 96),
        memory_mb=st.integers(16, 1 << 17),
    ),
    st.sampled_from(sorted(POLICIES)),
    st.floats(0, 4),
)
def test_the_inline_fit_check_of_curve_policies_is_the_rule(
    cand: Candidate, guest: GuestConfig, name: str, memory_weight: float
) -> None:
    """`curve_policy` copies the fit check into its score for speed: it refuses exactly the
    guests that `souk.models.fit.misfit` says do not fit, whatever the curve and weights."""
    policies = [
        POLICIES[name],
        curve_policy(CURVES[name], cpu_weight=1, memory_weight=memory_weight),
    ]
    for policy in policies:
        assert (policy(cand, guest) == REFUSE) == (cand.misfit(guest) is not None)
        assert (policy(cand, guest) == REFUSE) == (not cand.fits(guest))
