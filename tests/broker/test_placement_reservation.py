"""Reserving on picked workers, real ones on loopback: the worker's refusal is the reason
given, a lost answer is cleaned up, a taken id of the caller's own is the caller's error,
creates beyond a worker's lane leave together, each answered as if alone, and confirmations
ride with the creates a worker is sent next."""

from __future__ import annotations

import asyncio
import socket
import time
from typing import Any

import pytest

from souk.broker.metrics import BrokerMetrics
from souk.broker.placement.candidates import Candidate
from souk.broker.placement.reservation import CREATES_IN_FLIGHT, Reserver, placing_client
from souk.clients.workers import WorkerCallError, WorkerClient
from souk.models.api import ConfirmationResult, Refusal
from souk.models.machine import CreateMachine, Machine
from tests.support.broker_cluster import Cluster, ClusterFactory, WorkerSpec
from tests.support.waiting import eventually

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
        with pytest.raises(WorkerCallError) as raised:
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


def sent(metrics: BrokerMetrics) -> tuple[float, float]:
    """Reservation requests sent, and the creates they carried."""
    read = metrics.metrics.registry.get_sample_value
    count = read("souk_broker_reservation_creates_count")
    total = read("souk_broker_reservation_creates_sum")
    return count or 0.0, total or 0.0


async def test_creates_beyond_a_workers_lane_go_together_in_one_request(
    make_cluster: ClusterFactory,
) -> None:
    """Creates at once on one worker: two leave at once, the rest wait for the first answer and
    leave together, on a held connection (over TLS, each one more would be a handshake)."""
    async with make_cluster([WorkerSpec("one", "mad", cpus=16)]) as c:
        port = int(c.urls["one"].rsplit(":", 1)[1])
        before = connections_to(port)  # the cluster's own (its broker's)
        metrics = BrokerMetrics()
        reserver = Reserver(placing_client(), sent=metrics.reservation_creates)
        refusals: list[Refusal] = []
        cand = candidate(c, "one")
        placed = await asyncio.gather(
            *(reserver.reserve(cand, CREATE, 5, refusals) for _ in range(8))
        )
        assert refusals == []
        ids = {m.id for m in placed if m is not None}
        assert len(ids) == 8 and ids == {m.id for m in c.engines["one"].machines()}
        assert CREATES_IN_FLIGHT == 2 and sent(metrics) == (3, 8)  # 1, 1, then the other 6
        assert 1 <= connections_to(port) - before <= CREATES_IN_FLIGHT
        await reserver.client.close()


async def test_a_refusal_in_a_batch_is_that_creates_alone(make_cluster: ClusterFactory) -> None:
    async with make_cluster([WorkerSpec("one", "mad", cpus=5)]) as c:
        reserver = Reserver(placing_client())
        refusals: list[Refusal] = []
        cand = candidate(c, "one")
        placed = await asyncio.gather(
            *(reserver.reserve(cand, CREATE, 5, refusals) for _ in range(8))
        )
        assert (
            len([m for m in placed if m is not None]) == 5 == c.engines["one"].capacity().machines
        )
        assert [r.worker for r in refusals] == ["one"] * 3
        assert all("free 0 cpus" in r.reason for r in refusals)
        assert reserver.pending == 0  # refusals are answers: nothing to clean up
        await reserver.client.close()


async def test_a_create_whose_time_runs_out_in_the_lane_is_never_sent(
    make_cluster: ClusterFactory,
) -> None:
    async with make_cluster([WorkerSpec("one", "mad")]) as c:
        metrics = BrokerMetrics()
        reserver = Reserver(placing_client(), sent=metrics.reservation_creates)
        refusals: list[Refusal] = []
        cand = candidate(c, "one")
        times = [5.0] * CREATES_IN_FLIGHT + [0.001]  # the last waits longer than it may
        placed = await asyncio.gather(*(reserver.reserve(cand, CREATE, t, refusals) for t in times))
        assert placed[-1] is None and all(m is not None for m in placed[:-1])
        assert [r.worker for r in refusals] == ["one"] and "busy" in refusals[0].reason
        assert c.engines["one"].capacity().machines == CREATES_IN_FLIGHT
        assert sent(metrics) == (CREATES_IN_FLIGHT, CREATES_IN_FLIGHT)
        assert reserver.pending == 0  # nothing was sent: nothing to clean up
        assert not reserver.liveness.shunned("one")  # a busy worker is not a failing one
        await reserver.client.close()


async def test_a_create_given_up_while_it_waits_is_never_sent(
    make_cluster: ClusterFactory,
) -> None:
    async with make_cluster([WorkerSpec("one", "mad", cpus=8)]) as c:
        metrics = BrokerMetrics()
        reserver = Reserver(placing_client(), sent=metrics.reservation_creates)
        refusals: list[Refusal] = []
        cand = candidate(c, "one")
        tasks = [
            asyncio.create_task(reserver.reserve(cand, CREATE, 5, refusals))
            for _ in range(CREATES_IN_FLIGHT + 2)
        ]
        await asyncio.sleep(0)  # every one has been sent or is waiting
        tasks[-1].cancel()  # its client went away
        placed = await asyncio.gather(*tasks[:-1])
        assert all(m is not None for m in placed) and refusals == []
        assert c.engines["one"].capacity().machines == CREATES_IN_FLIGHT + 1
        assert sent(metrics) == (CREATES_IN_FLIGHT + 1, CREATES_IN_FLIGHT + 1)
        await reserver.client.close()


async def test_each_create_of_a_batch_keeps_its_own_deadline(make_cluster: ClusterFactory) -> None:
    """A create with little time left does not cut short the batch it leaves in: it alone
    times out, as it would alone, and the others are answered."""
    async with make_cluster([WorkerSpec("one", "mad", cpus=8)]) as c:
        engine, cand = c.engines["one"], candidate(c, "one")
        reserver = Reserver(placing_client())
        for fenced in ("fenced01", "fenced02"):  # creates of these are refused at once
            with pytest.raises(WorkerCallError):
                await reserver.client.destroy("one", c.urls["one"], fenced, fence=True)
        # a slow disk: the worker's next commits wait behind a long one
        slow = asyncio.create_task(engine.store.write(lambda tx: time.sleep(1.2)))
        await asyncio.sleep(0.05)
        refusals: list[Refusal] = []
        quick = [CREATE.model_copy(update={"id": f}) for f in ("fenced01", "fenced02")]
        placed = await asyncio.gather(
            *(reserver.reserve(cand, q, 5, refusals) for q in quick),  # the lane's two
            reserver.reserve(cand, CREATE, 5, refusals),  # these two leave together
            # out of time before the slow commit ends, not before the fenced two are answered
            # and it leaves (a loaded host took 0.2 s for those)
            reserver.reserve(cand, CREATE, 0.6, refusals),
            return_exceptions=True,
        )
        await slow
        assert all(isinstance(p, WorkerCallError) and p.http_status == 409 for p in placed[:2])
        patient, hurried = placed[2:]
        assert isinstance(patient, Machine) and hurried is None
        timed_out = [r for r in refusals if "no answer" in r.reason]  # the rest: the fenced ids
        assert len(timed_out) == 1 and len(refusals) == 3
        # the hurried one's create was sent, so it may have happened: it is cleaned up
        await eventually(lambda: {m.id for m in engine.machines()} == {patient.id})
        await reserver.close()
        await reserver.client.close()


class CountedConfirmations:
    """Counts the confirmation requests of their own a worker client sends."""

    def __init__(self, client: WorkerClient) -> None:
        self.sent = 0
        self._confirm = client.confirm
        client.confirm = self  # type: ignore[method-assign]

    async def __call__(self, *args: Any, **kwargs: Any) -> ConfirmationResult:
        self.sent += 1
        return await self._confirm(*args, **kwargs)


async def test_confirmations_ride_with_the_next_creates_of_a_busy_worker(
    make_cluster: ClusterFactory,
) -> None:
    """A confirmation due while creates to its worker are out goes with the next ones its lane
    sends, in no request of its own; one due to an idle worker goes at once, on its own."""
    async with make_cluster([WorkerSpec("one", "mad", cpus=16)]) as c:
        engine, cand = c.engines["one"], candidate(c, "one")
        reserver = Reserver(placing_client(), hold=30)
        alone = CountedConfirmations(reserver.client)
        refusals: list[Refusal] = []
        first = await reserver.reserve(cand, CREATE, 5, refusals)
        assert first is not None and first.id and engine.provisional_until(first.id) is not None
        burst = [
            asyncio.create_task(reserver.reserve(cand, CREATE, 5, refusals))
            for _ in range(CREATES_IN_FLIGHT + 2)
        ]
        await asyncio.sleep(0)  # the lane's two are out, two wait for one of them
        reserver.confirm("one", c.urls["one"], first.id)
        placed = await asyncio.gather(*burst)
        assert engine.provisional_until(first.id) is None  # answered with the batch it rode in
        assert alone.sent == 0 and reserver.confirmations_pending == 0
        for machine in placed:  # the lane is idle now: these leave at once, together
            assert machine is not None and machine.id
            reserver.confirm("one", c.urls["one"], machine.id)
        await eventually(lambda: reserver.confirmations_pending == 0)
        assert alone.sent == 1
        assert all(m and m.id and engine.provisional_until(m.id) is None for m in placed)
        assert refusals == []
        await reserver.client.close()
