"""The typed clients against a real broker and real workers on loopback: answers parsed into the
shared models, refusals decoded from the shared error body into each boundary's error, and no
answer at all reported as status 0."""

from __future__ import annotations

import socket
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from souk.clients.machines import MachinesApiError, MachinesClient
from souk.clients.workers import WorkerCallError, WorkerClient
from souk.models.api import CreateLeaseRequest, CreateMachineRequest, MetadataPatch
from souk.models.machine import GuestConfig, InitConfig, MachineConfig
from tests.support.broker_cluster import WorkerSpec, cluster


def sleeper(region: str = "mad", cpus: int = 1) -> CreateMachineRequest:
    config = MachineConfig(init=InitConfig(exec=["sleep", "60"]), guest=GuestConfig(cpus=cpus))
    return CreateMachineRequest(region=region, config=config)


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


async def test_the_machines_client_speaks_the_public_api(tmp_path: Path) -> None:
    async with cluster(tmp_path, [WorkerSpec("m1", "mad", cpus=2)]) as c:
        url = str(c.broker.make_url("")).rstrip("/")
        async with MachinesClient(url, c.tokens["admin"]) as api:
            assert await api.app_exists("demo") and not await api.app_exists("ghost")
            assert not await api.ensure_app("demo") and await api.ensure_app("shop")
            m = await api.create("demo", sleeper())
            assert m.worker == "m1" and m.config.init.exec == ["sleep", "60"]
            assert await api.wait("demo", m.id, "started", 5)
            assert not await api.wait("demo", m.id, "destroyed", 0.2)

            assert await api.get_lease("demo", m.id) is None
            lease = await api.lease("demo", m.id, CreateLeaseRequest(description="test", ttl=30))
            held = await api.get_lease("demo", m.id)
            assert held is not None and held.nonce == lease.nonce and held.description == "test"
            patch = MetadataPatch(metadata={"a": "1"})
            with pytest.raises(MachinesApiError) as refused:  # the lease keeps others out
                await api.patch_metadata("demo", m.id, patch)
            assert refused.value.http_status == 409
            await api.patch_metadata("demo", m.id, patch, lease.nonce)
            await api.patch_metadata("demo", m.id, MetadataPatch(metadata={"a": None}), lease.nonce)
            assert (await api.machine("demo", m.id)).config.metadata == {}

            with pytest.raises(MachinesApiError) as missing:
                await api.machine("demo", "nope")
            assert (missing.value.http_status, missing.value.reason) == (404, "not_found")
            with pytest.raises(MachinesApiError) as full:
                await api.create("demo", sleeper(cpus=2))
            assert full.value.http_status == 412
            assert full.value.reason == "insufficient_capacity"
            assert "\n  m1: " in str(full.value)  # each worker's refusal, one a line

            gone = await api.destroy("demo", m.id, lease.nonce, force=True)
            assert gone.id == m.id
            assert await api.wait("demo", m.id, "destroyed", 5)


async def test_no_answer_and_foreign_answers_are_errors_of_the_boundary() -> None:
    async with MachinesClient(f"http://127.0.0.1:{closed_port()}", "t") as api:
        with pytest.raises(MachinesApiError) as unreachable:
            await api.machines("demo")
    assert (unreachable.value.http_status, unreachable.value.reason) == (0, "unreachable")
    assert str(unreachable.value).startswith("cannot reach http://127.0.0.1:")

    async def gateway(_: web.Request) -> web.Response:  # a load balancer in front of a broker
        return web.Response(status=502, text="<html>bad gateway</html>")

    app = web.Application()
    app.router.add_get("/v1/apps/demo/machines", gateway)
    server = TestServer(app, host="127.0.0.1")
    async with server, MachinesClient(str(server.make_url("")), "t") as api:
        with pytest.raises(MachinesApiError) as foreign:
            await api.machines("demo")
    assert (foreign.value.http_status, foreign.value.reason) == (502, "error")
    assert foreign.value.message == "<html>bad gateway</html>"


async def test_the_worker_client_speaks_a_workers_api(tmp_path: Path) -> None:
    async with cluster(tmp_path, [WorkerSpec("m1", "mad")]) as c:
        base = c.urls["m1"]
        async with WorkerClient() as workers:
            assert (await workers.capacity("m1", base)).worker == "m1"
            assert (await workers.cordon("m1", base)).cordoned
            assert not (await workers.cordon("m1", base, cordoned=False)).cordoned
            with pytest.raises(WorkerCallError) as missing:
                await workers.machine("m1", base, "nope")
            assert (missing.value.http_status, missing.value.reason) == (404, "not_found")
            assert str(missing.value).startswith("worker m1: ")
            with pytest.raises(WorkerCallError):
                async with workers.logs("m1", base, "nope", {"stream": "stdout"}):
                    pytest.fail("an error answer is raised before any chunk")

            resp = await c.call("POST", "/v1/apps/demo/machines", json=sleeper().model_dump())
            mid = (await resp.json())["id"]
            reached, where = await workers.wait(
                "m1", base, mid, {"state": "destroyed", "timeout": "0.1"}, 0.1
            )
            assert not reached and where.state == "started"  # a 408 is a no, not an error
            gone = await workers.destroy("m1", base, mid, force=True)
            assert gone.id == mid

        async with WorkerClient() as workers:
            with pytest.raises(WorkerCallError) as unreachable:
                await workers.capacity("w9", f"http://127.0.0.1:{closed_port()}")
    assert (unreachable.value.http_status, unreachable.value.reason) == (0, "unreachable")
