"""The placement study's harness (bench/study.py) at a tiny size: the real placer over simulated
workers places where its design says, refuses only what no worker can take, and a lagging
catalog read by several brokers at once makes workers refuse reservations."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parents[2] / "bench"
if str(BENCH) not in sys.path:
    sys.path.insert(0, str(BENCH))

import study  # noqa: E402

SMALL = study.Shape(4, 4096, ("shared",), 1.0)


def workers(count: int, shape: study.Shape = SMALL) -> list[study.SimWorker]:
    return [study.SimWorker(f"mad-{i}", "mad", shape) for i in range(count)]


def creates(count: int, size: int = 0, group: int | None = None) -> list[study.Arrival]:
    """`count` creates of the fly workload's size `size` in mad, one a second, living forever;
    with `group`, all at once as one deploy."""
    return [
        study.Arrival(0.0 if group else float(i), 1e12, size, "mad", "img:1", group or i + 1)
        for i in range(count)
    ]


def run(design: str, fleet, stream, brokers: int = 1, lag: float | None = None):
    spec = study.RunSpec(design, "fly", len(fleet), 0, brokers=brokers, lag=lag)
    harness = study.Run(spec, fleet, stream)
    return harness, asyncio.run(harness.run())


def test_first_fit_fills_the_first_worker_before_the_second():
    fleet = workers(3)
    run("first-fit", fleet, creates(5))  # 1 cpu, 256 MB each: four fit a worker
    assert [len(w.machines) for w in fleet] == [4, 1, 0]


def test_spread_takes_the_emptiest_worker_each_time():
    fleet = workers(3)
    run("worst-fit", fleet, creates(6))
    assert [len(w.machines) for w in fleet] == [2, 2, 2]


def test_a_refusal_comes_only_when_no_worker_has_room():
    for design in ("first-fit", "offers", "catalog", "auto"):
        fleet = workers(4)
        _, result = run(design, fleet, creates(20))  # 16 fit
        assert (result.placed, result.refused) == (16, 4), design
        assert result.refused_while_room == 0, design
        assert all(w.cpus_reserved == w.cpus for w in fleet), design
        assert result.util_first_refusal == 1.0, design


def test_brokers_on_a_lagging_catalog_collide_and_retry_where_a_central_scheduler_does_not():
    # Two creates make one worker the fullest, which souk's default curve ranks first; then a
    # deploy of eight at once, on two brokers whose catalog is 50 ms behind.
    deploy = [study.Arrival(10.0, 1e12, 0, "mad", "img:1", 99) for _ in range(8)]
    stream = [*creates(2), *deploy]
    _, herded = run("catalog", workers(4), stream, brokers=2, lag=0.05)
    assert herded.placed == 10
    assert herded.conflicts > 0  # they all picked that worker; it refused what did not fit
    _, central = run("best-fit", workers(4), stream)
    assert (central.placed, central.conflicts) == (10, 0.0)


def test_the_pull_model_counts_the_claims_that_lost():
    _, result = run("pull", workers(4), creates(1))
    assert result.lost_claims == 3.0  # four workers with room claimed; one won


def test_the_full_plan_runs_every_seed_at_every_fleet_size_and_in_parts():
    plan = study.full_plan(seeds=3, huge_seeds=2)
    seeds = {
        (r.design, r.workers): {
            x.seed for x in plan.runs if (x.design, x.workers) == (r.design, r.workers)
        }
        for r in plan.runs
    }
    assert seeds[("catalog", 1000)] == {0, 1, 2}
    assert seeds[("auto", 10000)] == {0, 1}
    assert {h.seed for h in plan.herds if h.design == "offers"} == {0, 1, 2}
    part = study.full_plan(seeds=3, only=("best-fit",))
    assert {r.design for r in part.runs} == {"best-fit"} and not part.herds


def test_a_study_made_in_parts_merges_into_one():
    def part(design: str, seed: int, conflicts: float) -> dict[str, Any]:
        run = {
            "design": design,
            "workload": "fly",
            "workers": 100,
            "seed": seed,
            "conflicts": conflicts,
        }
        return {
            "machine": "m",
            "made_by": f"bench/study.py --only {design}",
            "notes": ["n"],
            "seconds": 10.0,
            "load": {"min": 1.0, "mean": 2.0, "max": 3.0},
            "partial": design == "p2c",
            "sources": {},
            "runs": [run],
            "herds": [],
        }

    merged = study.merge([part("catalog", 0, 0.5), part("p2c", 0, 0.1), part("catalog", 0, 0.3)])
    assert sorted((r["design"], r["conflicts"]) for r in merged["runs"]) == [
        ("catalog", 0.3),  # the later part's run of the same design and seed
        ("p2c", 0.1),
    ]
    assert merged["partial"] and merged["seconds"] == 10.0 and merged["notes"] == ["n"]


def test_two_traces_compare_deploy_by_deploy():
    # deploy 1: one create, alike; deploy 2: three creates, the same workers in another order;
    # deploy 3: two creates, one placed elsewhere.
    harness = [(1, "a", 0), (2, "a", 1), (2, "b", 0), (2, None, 2), (3, "a", 0), (3, "b", 0)]
    cluster = [(1, "a", 0), (2, None, 2), (2, "a", 0), (2, "b", 0), (3, "a", 0), (3, "c", 1)]
    matched, diverged, by_burst = study.compare(harness, cluster)
    assert (matched, diverged) == (4, 4)
    assert by_burst == {"1": (0, 0), "2-5": (3, 3)}


def test_a_real_cluster_sharing_the_harness_ties_places_its_creates_alike(tmp_path):
    # The first creates of the validation's stream (a deploy of 50 among them) through the
    # harness and a real broker over HTTP, with sim workers behind loopback HTTP. Not every
    # deploy need match: each create of a deploy ranks with draws of its own, and which of them
    # a full worker refuses (and so which next pick is tried) follows the order their requests
    # reach it, the host's in the cluster.
    v = asyncio.run(study.validate_one("offers", 0, tmp_path, draws=0, limit=120))
    # The deploy of 50 does not herd, in either: each create ranks its workers as they will be
    # once what the broker is reserving lands (placement/pending.py).
    assert v.harness_conflicts == v.cluster_conflicts == 0
    assert v.matched >= 0.9 * v.creates
    assert v.cluster_refused == v.harness_refused == 0
