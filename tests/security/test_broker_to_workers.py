"""A broker reaching workers over mutual TLS: its own certificate shown, and each worker's
certificate checked for the worker id it meant. A catalog row whose address leads to another
server, however valid that server's certificate, gets no machine's config."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from souk.broker.runtime import BrokerSettings, broker_site
from souk.broker.tokens import mint
from souk.catalog.bus import InProcessBus
from souk.clients.workers import WorkerCallError, WorkerClient
from souk.pki import NodeFiles
from tests.security.conftest import Impostor, TlsWorker, impostor, tls_worker
from tests.support.pki import Pki
from tests.support.waiting import eventually

SECRET = b"security-test-secret-0123456789"
CONFIG = {"init": {"exec": ["sleep", "60"]}, "guest": {"cpus": 1, "memory_mb": 256}}


@dataclass
class Api:
    url: str
    http: aiohttp.ClientSession

    async def call(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        headers = {"Authorization": f"Bearer {mint(SECRET, operator=True)}"}
        async with self.http.request(method, self.url + path, json=body, headers=headers) as r:
            return r.status, await r.json(content_type=None)

    async def create(self, region: str) -> tuple[int, Any]:
        return await self.call(
            "POST", "/v1/apps/demo/machines", {"region": region, "config": CONFIG}
        )


@contextlib.asynccontextmanager
async def broker(
    tmp: Path,
    bus: InProcessBus | None,
    tls: NodeFiles | None,
    workers: int,
    urls: tuple[str, ...] = (),
    **opts: Any,
) -> AsyncIterator[Api]:
    """A broker over `bus` (or polling `urls`), once it lists `workers` workers."""
    options = BrokerSettings(
        host="127.0.0.1",
        port=0,
        secret=SECRET,
        workers=list(urls),
        registry_dir=tmp / "registry",
        tls=tls,
        **opts,
    )
    async with broker_site(options, bus) as url, aiohttp.ClientSession() as http:
        api = Api(url, http)
        assert (await api.call("POST", "/v1/apps", {"name": "demo"}))[0] == 201

        async def listed() -> bool:
            return len((await api.call("GET", "/v1/workers"))[1]) == workers

        await eventually(listed)
        yield api


@contextlib.asynccontextmanager
async def forged_cluster(
    tmp: Path, pki: Pki, forged_region: str, tls_impostor: bool = True
) -> AsyncIterator[tuple[Api, TlsWorker, TlsWorker, Impostor]]:
    """w1 in mad, honest; w2 (much bigger, so it ranks first) in `forged_region`, its row
    pointing at an impostor that holds a valid worker certificate for `evil`."""
    bus = InProcessBus()
    async with contextlib.AsyncExitStack() as stack:
        stack.push_async_callback(bus.close)
        w1 = await stack.enter_async_context(tls_worker(tmp, pki, "w1", "mad", bus))
        evil = await stack.enter_async_context(impostor(pki, "evil", tls=tls_impostor))
        w2 = await stack.enter_async_context(
            tls_worker(tmp, pki, "w2", forged_region, bus, cpus=64, advertise=evil.url)
        )
        tls = pki.node("broker", "broker-1")
        api = await stack.enter_async_context(broker(tmp, bus, tls, 2, policy="spread"))
        yield api, w1, w2, evil


async def test_the_broker_places_and_runs_machines_on_tls_workers(tmp_path: Path, pki: Pki) -> None:
    bus = InProcessBus()
    async with (
        tls_worker(tmp_path, pki, "w1", "mad", bus) as w1,
        tls_worker(tmp_path, pki, "w2", "mad", bus),
        broker(tmp_path, bus, pki.node("broker", "broker-1"), 2) as api,
    ):
        status, machine = await api.create("mad")
        assert status == 200, machine
        mid = machine["id"]
        path = f"/v1/apps/demo/machines/{mid}"
        status, waited = await api.call("GET", f"{path}/wait?state=started&timeout=10")
        assert status == 200, waited
        assert (await api.call("POST", f"{path}/stop"))[0] == 200
        status, _ = await api.call("GET", f"{path}/wait?state=stopped&timeout=10")
        assert status == 200
        status, listed = await api.call("GET", "/v1/apps/demo/machines")
        assert [m["id"] for m in listed] == [mid]
        status, events = await api.call("GET", f"{path}/events")
        assert status == 200 and events
        if machine["worker"] == "w1":
            assert w1.engine.get(mid).state == "stopped"
        assert (await api.call("DELETE", f"{path}?force=true"))[0] == 200
    await bus.close()


async def test_a_row_pointing_at_another_worker_gets_no_reservation(
    tmp_path: Path, pki: Pki
) -> None:
    async with forged_cluster(tmp_path, pki, "sin") as (api, _, w2, evil):
        status, body = await api.create("sin")
        assert status == 412, body
        refusals = {r["worker"]: r["reason"] for r in body["details"]["refusals"]}
        assert "not valid for 'w2'" in refusals["w2"], refusals
        assert evil.seen == []  # not a byte of HTTP reached it
        assert w2.engine.machines(None) == []


async def test_the_create_goes_to_an_honest_worker_instead(
    tmp_path: Path, pki: Pki, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.WARNING, "souk.broker")
    async with forged_cluster(tmp_path, pki, "mad") as (api, w1, w2, evil):
        for _ in range(3):
            status, machine = await api.create("mad")
            assert status == 200, machine
            assert machine["worker"] == "w1"
            assert [m.id for m in w1.engine.machines(None)].count(machine["id"]) == 1
        assert evil.seen == []
        assert w2.engine.machines(None) == []
    # w2 ranked first each time: the broker tried it, and refused to send it anything.
    assert any("w2" in r.getMessage() for r in caplog.records)


async def test_a_plain_http_row_gets_nothing_from_a_tls_broker(tmp_path: Path, pki: Pki) -> None:
    async with forged_cluster(tmp_path, pki, "sin", tls_impostor=False) as (api, _, _, evil):
        status, body = await api.create("sin")
        assert status == 412, body
        refusals = {r["worker"]: r["reason"] for r in body["details"]["refusals"]}
        assert "plain http" in refusals["w2"], refusals
        assert evil.seen == []


async def test_a_kept_alive_connection_never_carries_another_workers_request(
    pki: Pki,
) -> None:
    """The client pools connections, but by the name they were verified for: one opened to
    `evil` (legitimately) is not reused for a request meant for `w2` at the same address."""
    async with impostor(pki, "evil") as evil, WorkerClient(tls=pki.node("broker", "b1")) as client:
        assert await client._request("evil", evil.url, "GET", "/v1/capacity") == {"taken": True}
        with pytest.raises(WorkerCallError) as refused:
            await client.capacity("w2", evil.url)
        assert refused.value.reason == "untrusted"
        assert refused.value.http_status == 0
        assert "not valid for 'w2'" in refused.value.message
        assert len(evil.seen) == 1


async def test_a_worker_id_that_is_no_certificate_name_is_refused(pki: Pki) -> None:
    async with impostor(pki, "evil") as evil, WorkerClient(tls=pki.node("broker", "b1")) as client:
        with pytest.raises(WorkerCallError) as refused:
            await client.capacity("Evil_1", evil.url)
        assert refused.value.reason == "untrusted"
        assert evil.seen == []


async def test_a_static_list_of_tls_workers_is_checked_by_its_urls(
    tmp_path: Path, pki: Pki
) -> None:
    """Without a catalog the broker knows only URLs at first: each is checked against its host
    (the certificates carry 127.0.0.1), then by the id the worker gave."""
    async with (
        tls_worker(tmp_path, pki, "w1", "mad") as w1,
        broker(tmp_path, None, pki.node("broker", "broker-1"), 1, (w1.url,)) as api,
    ):
        status, machine = await api.create("mad")
        assert status == 200, machine
        assert machine["worker"] == "w1"
        status, listed = await api.call("GET", "/v1/apps/demo/machines")
        assert [m["id"] for m in listed] == [machine["id"]]
