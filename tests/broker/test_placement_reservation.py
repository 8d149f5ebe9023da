"""Reserving on picked workers, real ones on loopback: the worker's refusal is the reason
given, a lost answer is cleaned up, and a taken id of the caller's own is the caller's error."""

from __future__ import annotations

import asyncio
import socket

import pytest

from souk.broker.placement.candidates import Candidate
from souk.broker.placement.reservation import CONNECTIONS_PER_WORKER, Reserver, placing_client
from souk.clients.workers import WorkerClient, WorkerError
from souk.models.api import Refusal
from souk.models.machine import CreateMachine
from tests.support.broker_cluster import Cluster, ClusterFactory, WorkerSpec

CREATE = CreateMachine.model_validate(
    {"app": "demo", "config": {"init": {"exec": ["sleep", "60"]}, "guest": {"cpus": 1}}}
)


def candidate(c: Cluster, name: str) -> Candidate:
    return Candidate.from_capacity(c.engines[name].capacity(), c.urls[name])


async def test_a_reservation_is_the_workers_answer(make_cluster: ClusterFactory) -> None:
    async with make_cluster([WorkerSpec("one", "mad", cpus=1)]) as c:
        stale = candidate(c, "one")  # shows the cpu that the first machine is about to take
        reserver = Reserver(WorkerClient())
        refusals: list[Refusal] = []
        first = await reserver.reserve(stale, CREATE, 5, refusals)
        assert first is not None and first.worker == "one" and refusals == []
        assert await reserver.reserve(stale, CREATE, 5, refusals) is None
        assert [r.worker for r in refusals] == ["one"]
        assert "free 0 cpus" in refusals[0].reason
        assert c.engines["one"].capacity().machines == 1
        assert reserver.pending == 0  # a refusal is an answer: nothing to clean up
        await reserver.client.close()


async def test_a_lost_answer_is_cleaned_up_in_the_background(make_cluster: ClusterFactory) -> None:
    async with make_cluster([WorkerSpec("one", "mad")]) as c:
        with socket.socket() as closed:
            closed.bind(("127.0.0.1", 0))
            host, port = closed.getsockname()
        gone = Candidate.from_capacity(c.engines["one"].capacity(), f"http://{host}:{port}")
        reserver = Reserver(WorkerClient())
        refusals: list[Refusal] = []
        assert await reserver.reserve(gone, CREATE, 5, refusals) is None
        assert [r.worker for r in refusals] == ["one"]
        assert reserver.pending == 1  # the DELETE of the attempt's id, which may exist
        await asyncio.sleep(0.5)
        # nobody answers there: it is retried, not dropped (test_cleanup.py sees it finish)
        assert reserver.pending == 1
        await reserver.close()
        assert reserver.pending == 0
        await reserver.client.close()


async def test_a_taken_id_of_the_callers_own_is_raised(make_cluster: ClusterFactory) -> None:
    async with make_cluster([WorkerSpec("one", "mad")]) as c:
        reserver = Reserver(WorkerClient())
        named = CREATE.model_copy(update={"id": "mine0001"})
        refusals: list[Refusal] = []
        assert await reserver.reserve(candidate(c, "one"), named, 5, refusals) is not None
        with pytest.raises(WorkerError) as raised:
            await reserver.reserve(candidate(c, "one"), named, 5, refusals)
        assert (raised.value.http_status, raised.value.reason) == (409, "already_exists")
        await reserver.client.close()


def connections_to(port: int) -> int:
    """Established TCP connections to `port` on loopback, as the kernel lists them."""
    count = 0
    with open("/proc/net/tcp") as table:
        for line in list(table)[1:]:
            fields = line.split()
            if fields[3] == "01" and int(fields[2].split(":")[1], 16) == port:
                count += 1
    return count


async def test_placement_holds_at_most_two_connections_to_a_worker(
    make_cluster: ClusterFactory,
) -> None:
    """Creates at once on one worker wait for a held connection rather than open more (over
    TLS, each one more is a handshake)."""
    async with make_cluster([WorkerSpec("one", "mad", cpus=16)]) as c:
        port = int(c.urls["one"].rsplit(":", 1)[1])
        before = connections_to(port)  # the cluster's own (its broker's)
        reserver = Reserver(placing_client())
        refusals: list[Refusal] = []
        cand = candidate(c, "one")
        placed = await asyncio.gather(
            *(reserver.reserve(cand, CREATE, 5, refusals) for _ in range(8))
        )
        assert all(m is not None for m in placed) and refusals == []
        assert 1 <= connections_to(port) - before <= CONNECTIONS_PER_WORKER == 2
        await reserver.client.close()
