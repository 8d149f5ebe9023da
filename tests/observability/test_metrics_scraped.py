"""Every part's /metrics after a scripted workload, in a real local cluster: two workers
running the example app as processes, a broker placing from its catalog replica, a proxy over a
replica of its own, and `souk catalog serve`'s app over that replica. Each scrape is parsed with
prometheus_client's parser, and the counters must have moved by what the workload did."""

from __future__ import annotations

from pathlib import Path

import pytest

from souk.broker.tokens import mint
from souk.cli.catalog import catalog_site
from tests.support.hello import PORT, hello_config
from tests.support.local_cluster import SECRET, local_cluster
from tests.support.scrape import Scrape, scrape
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

MAD = [("mad1", "mad"), ("mad2", "mad")]


async def test_each_part_counts_what_the_workload_did(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, MAD, ["hello", "watched"], idle_timeout=1.0) as c:
        # Workload: two creates placed, one a started machine with its own metrics, the other
        # created stopped and woken by the proxy, then stopped by it when idle; one create no
        # worker can take, one update refused for its version.
        watched = await c.create(
            "watched", "mad", hello_config(autostop=False, metrics={"port": PORT, "path": "/hi"})
        )
        sleeper = await c.create("hello", "mad", hello_config(autostop=True), skip_launch=True)
        await eventually(lambda: c.seen(sleeper["id"], "created"))
        too_big = {**hello_config(), "guest": {"cpus": 64}}
        await c.api(
            "POST",
            "/v1/apps/hello/machines",
            status=412,
            json={"region": "mad", "config": too_big},
        )
        await c.api(
            "POST",
            f"/v1/apps/hello/machines/{sleeper['id']}",
            status=412,
            json={"config": hello_config(), "current_version": "not-this-one"},
        )
        for i in range(5):
            status, _, _ = await c.get("hello", f"/{i}")
            assert status == 200
        await eventually(lambda: c.proxy.autostop.stopped == [sleeper["id"]], timeout=20)
        await c.serving("watched", watched)

        broker = await scrape(c.http, c.broker_url + "/metrics", c.token)
        placed = {"strategy": "offers", "outcome": "placed"}
        assert broker.value("souk_broker_placement_seconds_count", **placed) == 2
        refused = {"strategy": "offers", "outcome": "no_capacity"}
        assert broker.value("souk_broker_placement_seconds_count", **refused) == 1
        assert broker.value("souk_broker_placement_decision_seconds_count") == 2
        assert broker.value("souk_broker_offers_asked_total", strategy="offers") == 4
        assert broker.value("souk_broker_offers_answered_total", strategy="offers") == 4
        assert broker.value("souk_broker_no_capacity_refusals_total", reason="room") == 2
        assert broker.value("souk_broker_no_capacity_refusals_total") == 2
        errors = "souk_broker_http_errors_total"
        assert broker.value(errors, status="412", reason="insufficient_capacity") == 1
        assert broker.value(errors, status="412", reason="precondition_failed") == 1
        assert broker.value("souk_catalog_owners", state="reachable") >= 2  # its replica's

        workers: list[Scrape] = []

        def on_workers(name: str, **labels: str) -> float:
            return sum(w.value(name, **labels) for w in workers)

        async def stopped() -> bool:  # the worker's stop ends a moment after the broker's answer
            workers[:] = [await scrape(c.http, w.url + "/metrics") for w in c.workers.values()]
            return on_workers("souk_worker_operations_total", op="stop", outcome="done") > 0

        await eventually(stopped, timeout=20)

        # The create that started, the proxy's cold start, and the autostop's stop.
        assert on_workers("souk_worker_operations_total", op="start", outcome="done") == 2
        assert on_workers("souk_worker_operations_total", op="stop", outcome="done") == 1
        assert on_workers("souk_worker_operations_total", outcome="failed") == 0
        assert on_workers("souk_worker_step_seconds_count", op="start", step="spawn") == 2
        assert on_workers("souk_worker_machines", state="started") == 1
        assert on_workers("souk_worker_machines", state="stopped") == 1
        assert on_workers("souk_worker_capacity_total", resource="cpus") == 8
        assert on_workers("souk_worker_capacity_reserved", resource="cpus") == 2
        assert on_workers("souk_worker_oplog_group_size_sum") >= on_workers(
            "souk_worker_oplog_group_size_count"
        )
        assert on_workers("souk_worker_oplog_commit_seconds_count") > 0
        assert on_workers("souk_worker_restarts_total") == 0

        proxy = await scrape(c.http, c.proxy_url + "/metrics", c.token)
        assert proxy.value("souk_proxy_requests_total", code="2xx") == 5
        assert proxy.value("souk_proxy_requests_total") == 5
        assert proxy.value("souk_proxy_request_seconds_count") == 5
        assert proxy.value("souk_proxy_upstream_seconds_count") == 5
        assert proxy.value("souk_proxy_cold_starts_total", outcome="ok") == 1
        assert proxy.value("souk_proxy_cold_start_seconds_count") == 1
        assert proxy.value("souk_proxy_autostops_total", outcome="ok") == 1
        assert proxy.value("souk_proxy_forward_events_total", event="bad_gateway") == 0
        # Without a token the proxy's metrics are refused; an app's token is not enough.
        await scrape(c.http, c.proxy_url + "/metrics", status=401)
        await scrape(c.http, c.proxy_url + "/metrics", mint(SECRET, apps=["hello"]), 403)
        await scrape(c.http, c.broker_url + "/metrics", mint(SECRET, apps=["hello"]), 403)

        # The machine's own metrics, as Prometheus' HTTP service discovery reads them.
        targets = await c.api("GET", "/v1/prometheus/targets")
        assert targets == [
            {
                "targets": [f"[{watched['private_ip']}]:{PORT}"],
                "labels": {
                    "__metrics_path__": "/hi",
                    "__scheme__": "http",
                    "app": "watched",
                    "region": "mad",
                    "machine_id": watched["id"],
                    "instance_id": watched["instance_id"],
                    "worker": watched["worker"],
                },
            }
        ]
        headers = {"Authorization": f"Bearer {mint(SECRET, apps=['hello'])}"}
        async with c.http.get(c.broker_url + "/v1/prometheus/targets", headers=headers) as resp:
            assert resp.status == 200 and await resp.json() == []  # not its app's machine

        async with catalog_site(c.replica, "127.0.0.1", 0, None) as url:
            before = await scrape(c.http, url + "/metrics")
            owners = before.value("souk_catalog_owners")
            assert owners >= 3  # two workers and the app registry
            assert before.value("souk_catalog_lag_rows_bucket", le="+Inf") == owners
            assert before.value("souk_catalog_bus_connected") == 1
            assert before.value("souk_catalog_quarantined_rows") == 0
            applied = before.value("souk_catalog_applied_total")
            assert applied > 0
            await c.api(
                "POST",
                f"/v1/apps/watched/machines/{watched['id']}/stop",
            )
            await eventually(lambda: c.seen(watched["id"], "stopped"), timeout=20)
            after = await scrape(c.http, url + "/metrics")
            assert after.value("souk_catalog_applied_total") > applied
            assert after.value("souk_catalog_apply_seconds_count") > 0
