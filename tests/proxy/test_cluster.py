"""The proxy in a real local cluster: process-driver workers running the example app, a broker,
catalog replicas on an in-process bus. Machines are started, stopped and lost for real."""

from __future__ import annotations

import asyncio
import sys
from pathlib import Path

import pytest

from tests.support.hello import HELLO, hello_config
from tests.support.local_cluster import local_cluster
from tests.support.waiting import eventually

pytestmark = pytest.mark.integration

TWO_REGIONS = [("mad1", "mad"), ("mad2", "mad"), ("ams1", "ams")]


async def test_requests_go_to_started_machines_and_unknown_apps_are_404(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, TWO_REGIONS, ["hello", "empty"]) as c:
        a = await c.create("hello", "mad", hello_config(autostop=False))
        b = await c.create("hello", "ams", hello_config(autostop=False))
        for m in (a, b):
            await c.serving("hello", m)
        answered = set()
        for _ in range(6):
            status, headers, body = await c.get("hello", "/hi")
            assert status == 200
            assert body["machine"] == headers["souk-machine"]  # the app itself says who it is
            assert body["path"] == "/hi"
            assert headers["souk-region"] == body["region"]
            answered.add(body["machine"])
        assert answered == {a["id"]}  # the proxy's region (mad) first
        async with c.http.get(c.proxy_url + "/", headers={"Host": "hello.souk.local"}) as resp:
            assert resp.status == 200
        status, _, body = await c.get("ghost")
        assert status == 404 and body["code"] == "app_not_found"
        status, _, body = await c.get("empty")
        assert status == 503 and body["code"] == "no_machines"
        assert c.proxy.waker.starts == 0


async def test_scale_from_zero_starts_one_machine_then_idle_stops_it(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, TWO_REGIONS, ["hello"], idle_timeout=1.0) as c:
        ids = []
        for region in ("mad", "mad", "ams"):
            m = await c.create("hello", region, hello_config(autostop=True), skip_launch=True)
            ids.append(m["id"])
        for mid in ids:
            await eventually(lambda mid=mid: c.replica.machine(mid) is not None)
        assert [await c.state("hello", mid) for mid in ids] == ["created"] * 3

        results = await asyncio.gather(*(c.get("hello", f"/{i}") for i in range(10)))
        assert [status for status, _, _ in results] == [200] * 10
        answered = {body["machine"] for _, _, body in results}
        assert len(answered) == 1
        (woken,) = answered
        assert woken in ids[:2]  # a machine of the proxy's own region
        assert c.proxy.waker.starts == 1
        # every request followed that one start: none was sent before the port accepted
        assert c.proxy.forwarder.stats["connect_failures"] == 0
        states = {mid: await c.state("hello", mid) for mid in ids}
        assert [mid for mid, s in states.items() if s == "started"] == [woken]

        # Nothing more arrives: after the idle time the proxy stops it through the broker.
        await c.wait("hello", woken, "stopped")
        assert woken in c.proxy.autostop.stopped
        await eventually(lambda: c.seen(woken, "stopped"))

        # And the next request starts one again.
        status, _, body = await c.get("hello")
        assert status == 200 and body["machine"] in ids[:2]
        assert c.proxy.waker.starts == 2


async def test_a_machine_slower_to_accept_than_the_idle_timeout_is_not_stopped_under_its_request(
    tmp_path: Path,
) -> None:
    slow = [
        sys.executable,
        "-c",
        f"import runpy, time; time.sleep(2); runpy.run_path({str(HELLO)!r}, run_name='__main__')",
    ]
    async with local_cluster(tmp_path, TWO_REGIONS, ["hello"], idle_timeout=0.3) as c:
        m = await c.create("hello", "mad", hello_config(init={"exec": slow}), skip_launch=True)
        await eventually(lambda: c.replica.machine(m["id"]) is not None)
        status, _, body = await c.get("hello")
        assert status == 200 and body["machine"] == m["id"]
        assert c.proxy.waker.starts == 1 and m["id"] not in c.proxy.autostop.stopped


async def test_min_machines_running_and_autostop_off_are_respected(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, TWO_REGIONS, ["hello"], idle_timeout=0.5) as c:
        kept = [await c.create("hello", "mad", hello_config(min_running=1)) for _ in range(2)]
        pinned = await c.create("hello", "ams", hello_config(autostop=False))
        for m in [*kept, pinned]:
            await c.wait("hello", m["id"], "started")
        await eventually(lambda: len(c.proxy.autostop.stopped) == 1)
        (stopped,) = c.proxy.autostop.stopped
        assert stopped in {m["id"] for m in kept}
        await c.wait("hello", stopped, "stopped")
        await asyncio.sleep(1.5)  # three idle periods more: nothing else may stop
        assert len(c.proxy.autostop.stopped) == 1
        for m in [*kept, pinned]:
            if m["id"] != stopped:
                assert await c.state("hello", m["id"]) == "started"


async def test_a_backend_refusing_connections_is_retried_on_another(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, TWO_REGIONS, ["hello"]) as c:
        # Started, with a service port, but nothing listens there.
        deaf = hello_config(autostop=False)
        deaf["init"] = {"exec": ["sleep", "600"]}
        bad = await c.create("hello", "mad", deaf)
        good = await c.create("hello", "ams", hello_config(autostop=False))
        await c.wait("hello", bad["id"], "started")
        await eventually(lambda: c.seen(bad["id"], "started"))
        await c.serving("hello", good)
        for method in ("GET", "POST"):
            async with c.http.request(
                method, c.proxy_url + "/x", headers={"souk-app": "hello"}, data=b"body"
            ) as resp:
                if method == "POST":
                    assert resp.status == 501  # the example app has no POST; it did answer
                else:
                    assert resp.status == 200
                assert resp.headers["souk-machine"] == good["id"]
        assert c.proxy.forwarder.stats["connect_failures"] >= 1


async def test_a_machine_on_a_dead_worker_is_replaced_by_its_standby(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, TWO_REGIONS, ["hello"]) as c:
        primary = await c.create("hello", "mad", hello_config(autostop=False))
        standby = await c.create(
            "hello",
            "mad",
            hello_config(autostop=False, standbys=[primary["id"]]),
            skip_launch=True,
            avoid_workers=[primary["worker"]],
        )
        assert standby["worker"] != primary["worker"]
        await c.serving("hello", primary)
        await eventually(lambda: c.replica.machine(standby["id"]) is not None)
        status, headers, _ = await c.get("hello")
        assert status == 200 and headers["souk-machine"] == primary["id"]

        await c.workers[primary["worker"]].kill()
        await eventually(lambda: c.replica.worker(primary["worker"]).unreachable)  # type: ignore[union-attr]

        status, headers, body = await c.get("hello")
        assert status == 200
        assert headers["souk-machine"] == standby["id"] == body["machine"]
        assert await c.state("hello", standby["id"]) == "started"
        assert c.proxy.waker.starts >= 1
        for _ in range(3):
            status, headers, _ = await c.get("hello")
            assert status == 200 and headers["souk-machine"] == standby["id"]


async def test_a_request_for_a_suspended_machine_resumes_it(tmp_path: Path) -> None:
    async with local_cluster(tmp_path, TWO_REGIONS[:1], ["hello"]) as c:
        m = await c.create("hello", "mad", hello_config(autostop=False))
        await c.serving("hello", m)
        await c.api("POST", f"/v1/apps/hello/machines/{m['id']}/suspend")
        await c.wait("hello", m["id"], "suspended")
        await eventually(lambda: c.seen(m["id"], "suspended"))

        status, _, body = await c.get("hello", "/again")
        assert status == 200 and body["machine"] == m["id"]  # the same machine, resumed
        assert c.proxy.waker.starts == 1
        assert await c.state("hello", m["id"]) == "started"
