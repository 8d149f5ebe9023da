"""The pieces behind /metrics, in-process: bounded labels, the off switch, refusal kinds, and a
worker's numbers after a few operations."""

from __future__ import annotations

from pathlib import Path

from souk.broker.errors import DECLINED
from souk.broker.metrics import REFUSAL_KINDS, BrokerMetrics, refusal_kind
from souk.models.api import Refusal
from souk.models.fit import misfit
from souk.models.machine import CreateMachine, MachineConfig
from souk.web.metrics import OFF, OTHER, Bounded, Metrics
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from tests.support.engines import settings
from tests.support.scrape import Scrape, parse
from tests.support.waiting import eventually


def test_a_bounded_label_takes_at_most_its_limit_of_values_then_other() -> None:
    m = Metrics("t")
    counter = m.counter("things_total", "things", ("reason",))
    by_reason = Bounded(m, counter, limit=3)
    for i in range(10):
        by_reason(f"reason {i}").inc()
    by_reason("reason 0").inc()
    scrape = parse(m.render().decode())
    values = {s.labels["reason"]: s.value for s in scrape.samples if s.name == "t_things_total"}
    assert values == {"reason 0": 2, "reason 1": 1, "reason 2": 1, OTHER: 7}


def test_switched_off_every_child_records_nothing() -> None:
    metrics = BrokerMetrics(enabled=False)
    assert metrics.decision["offers"] is OFF
    metrics.offers("offers", 3, 2, [Refusal(worker="w", reason="cordoned")])
    metrics.refused("catalog", 0.1, ["draining"])
    metrics.error(412, "insufficient_capacity")
    text = metrics.metrics.render().decode()
    scrape = parse(text)
    assert scrape.value("souk_broker_offers_asked_total") == 0
    assert scrape.value("souk_broker_no_capacity_refusals_total") == 0
    assert scrape.value("souk_broker_http_errors_total") == 0
    assert "# HELP souk_broker_offers_asked_total" in text  # still described


def test_each_refusal_the_fit_rule_words_has_its_own_kind() -> None:
    room = misfit("shared", 8, 256, kinds=["shared"], cpus_free=1, memory_mb_free=1024)
    kind = misfit("performance", 1, 256, kinds=["shared"], cpus_free=1, memory_mb_free=1024)
    common = {"kinds": ["shared"], "cpus_free": 4, "memory_mb_free": 1024}
    cordoned = misfit("shared", 1, 256, cordoned=True, **common)  # type: ignore[arg-type]
    draining = misfit("shared", 1, 256, draining=True, **common)  # type: ignore[arg-type]
    found = {
        refusal_kind(m.reason): m.kind for m in (room, kind, cordoned, draining) if m is not None
    }
    assert found == {
        "room": "room",
        "cpu_kind": "cpu_kind",
        "cordoned": "cordoned",
        "draining": "draining",
    }
    assert refusal_kind(DECLINED) == "declined"
    assert refusal_kind("no offer: no offer within 0.50s") == "no_offer"
    assert refusal_kind("unreachable") == "unreachable"
    assert refusal_kind("the worker caught fire") == "other"
    assert set(REFUSAL_KINDS) >= {"room", "cpu_kind", "cordoned", "draining", "other"}


def test_counted_refusals_are_bound_up_front_and_by_kind() -> None:
    metrics = BrokerMetrics()
    reasons = ["not enough room: free 0 cpus, 0 MB"] * 3
    metrics.refused("catalog", 0.01, [*reasons, "??"])
    metrics.error(412, "insufficient_capacity")
    metrics.error(412, "insufficient_capacity")
    scrape = parse(metrics.metrics.render().decode())
    assert scrape.value("souk_broker_no_capacity_refusals_total", reason="room") == 3
    assert scrape.value("souk_broker_no_capacity_refusals_total", reason="other") == 1
    assert (
        scrape.value(
            "souk_broker_placement_seconds_count", strategy="catalog", outcome="no_capacity"
        )
        == 1
    )
    assert (
        scrape.value("souk_broker_http_errors_total", status="412", reason="insufficient_capacity")
        == 2
    )


async def test_a_worker_counts_its_operations_and_reads_its_machines_at_scrape(
    tmp_path: Path,
) -> None:
    s = settings(tmp_path)
    async with running(Engine(s, make_driver("sim", s))) as engine:
        config = MachineConfig.model_validate({"init": {"exec": ["sleep", "60"]}})
        ids = [(await engine.create(CreateMachine(app="a", config=config))).id for _ in range(3)]
        for mid in ids:
            assert (await engine.wait(mid, "started", 10, None))[0]
        await engine.submit(ids[0], "stop")
        assert (await engine.wait(ids[0], "stopped", 10, None))[0]

        def stop_counted() -> Scrape | None:  # the runner counts just after the last commit
            scrape = parse(engine.metrics.metrics.render().decode())
            stops = scrape.value("souk_worker_operations_total", op="stop", outcome="done")
            return scrape if stops else None

        scrape = await eventually(stop_counted)
    assert scrape.value("souk_worker_operations_total", op="start", outcome="done") == 3
    assert scrape.value("souk_worker_operations_total", op="stop", outcome="done") == 1
    assert scrape.value("souk_worker_step_seconds_count", op="stop", step="signal") == 1
    assert scrape.value("souk_worker_machines", state="started") == 2
    assert scrape.value("souk_worker_machines", state="stopped") == 1
    assert scrape.value("souk_worker_capacity_total", resource="memory_mb") == 4096
    assert scrape.value("souk_worker_capacity_reserved", resource="cpus") == 3
    commits = scrape.value("souk_worker_oplog_commit_seconds_count")
    assert commits == scrape.value("souk_worker_oplog_group_size_count") > 0
    # every write landed in some group: creates, op steps, the boot entry...
    assert scrape.value("souk_worker_oplog_group_size_sum") >= commits
    assert not any("machine" in s.labels for s in scrape.samples)  # no machine ids as labels
