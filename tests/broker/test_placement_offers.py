"""Reading offers: a candidate for each worker that offers, and a refusal named by the same
rule as the catalog's for each other one."""

from __future__ import annotations

from souk.broker.errors import DECLINED
from souk.broker.placement.offers import offered
from souk.clients.workers import WorkerCallError
from souk.models.api import Refusal
from souk.models.capacity import Capacity, Offer, Resources
from souk.models.machine import GuestConfig
from tests.broker.placement_data import SMALL, row


def offer(fits: bool, free_cpus: int = 4, cached: bool = False, **kw: object) -> Offer:
    cap = Capacity.model_validate(
        {
            "worker": "w",
            "region": "mad",
            "cpu_kinds": ["shared"],
            "total": Resources(cpus=4, memory_mb=4096),
            "reserved": Resources(cpus=4 - free_cpus, memory_mb=0),
            "free": Resources(cpus=free_cpus, memory_mb=4096),
            "machines": 0,
            **kw,
        }
    )
    return Offer(fits=fits, image_cached=cached, capacity=cap)


def test_a_worker_that_offers_is_a_candidate_with_its_own_numbers() -> None:
    refusals: list[Refusal] = []
    cands = offered([row("a")], [offer(True, free_cpus=3, cached=True)], SMALL, refusals)
    assert refusals == []
    assert [(c.worker, c.address, c.cpus_free, c.image_cached) for c in cands] == [
        ("w", "http://a", 3, True)
    ]


def test_each_worker_that_does_not_offer_says_why() -> None:
    rows = [row(n) for n in ("cordoned", "draining", "full", "perf", "declined", "down", "odd")]
    answers: list[Offer | BaseException] = [
        offer(False, cordoned=True),
        offer(False, draining=True),
        offer(False, free_cpus=0),
        offer(False),  # asked for a performance cpu below
        offer(False),  # fits by the numbers, yet the worker says no
        WorkerCallError("down", 0, "timeout", "no offer within 0.50s"),
        ValueError("bad answer"),
    ]
    refusals: list[Refusal] = []
    assert offered(rows[:3], answers[:3], SMALL, refusals) == []
    perf = GuestConfig(cpu_kind="performance")
    assert offered(rows[3:4], answers[3:4], perf, refusals) == []
    assert offered(rows[4:], answers[4:], SMALL, refusals) == []
    assert [(r.worker, r.reason) for r in refusals] == [
        ("cordoned", "cordoned"),
        ("draining", "draining"),
        ("full", "not enough room: free 0 cpus, 4096 MB"),
        ("perf", "no performance cpus"),
        ("declined", DECLINED),
        ("down", "no offer: no offer within 0.50s"),
        ("odd", "no offer: ValueError('bad answer')"),
    ]
