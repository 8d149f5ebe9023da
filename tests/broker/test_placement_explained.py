"""Placement explained: every create's decision is kept (the last N per broker) and shown by
`GET .../placement` and `souk machines why`; another broker says it did not record it."""

from __future__ import annotations

import asyncio

from aiohttp.test_utils import TestClient, TestServer
from typer.testing import CliRunner

from souk.broker.placement.candidates import Candidate
from souk.broker.placement.journal import Decision, Journal
from souk.broker.placement.pipeline import Placer
from souk.broker.placement.policies import POLICIES
from souk.broker.server import make_app
from souk.broker.state import Broker
from souk.cli.main import app as cli
from souk.clients.workers import WorkerClient
from souk.models.api import Refusal
from souk.models.machine import GuestConfig
from tests.broker.test_api import err, ok
from tests.support.broker_cluster import SECRET, ClusterFactory, WorkerSpec, machine_body

M = "/v1/apps/demo/machines"


def cand(worker: str, cpus_free: int = 4) -> Candidate:
    return Candidate(worker, "", ("shared",), 4, 4096, cpus_free, 4096)


def decision(
    machine: str, rounds: list[list[tuple[float, Candidate]]], refusals: list[Refusal]
) -> Decision:
    guest = GuestConfig(cpus=1, memory_mb=256)
    winner = rounds[-1][0][1].worker if rounds and rounds[-1] else ""
    return Decision(
        machine,
        "demo",
        "mad",
        "offers",
        POLICIES["spread"],
        guest,
        rounds,
        refusals,
        winner,
        0.0,
        0.002,
    )


def test_the_journal_keeps_only_the_last_decisions() -> None:
    journal = Journal(limit=3)
    for i in range(5):
        journal.record(decision(f"m{i}", [[(1.0, cand("w1"))]], []))
    assert len(journal) == 3
    assert journal.get("m0") is None and journal.get("m1") is None
    assert journal.get("m4") is not None
    # and fewer when they name many workers: memory stays bounded either way
    heavy = Journal(limit=100, weight=10)
    for i in range(5):
        heavy.record(decision(f"m{i}", [[(1.0, cand(f"w{n}")) for n in range(4)]], []))
    assert len(heavy) == 2 and heavy.get("m3") is not None and heavy.get("m4") is not None
    big = decision("big", [[(1.0, cand(f"w{n}")) for n in range(50)]], [])
    heavy.record(big)
    assert len(heavy) == 1 and heavy.get("big") is big  # the newest is always kept


def test_an_explanation_merges_ranks_offers_and_refusals() -> None:
    # w2 ranked first but refused the reservation, so w1 took it; w3 did not fit.
    ranked = [(0.9, cand("w2")), (0.5, cand("w1"))]
    refusals = [Refusal(worker="w3", reason="needs 1 cpus, 0 free")]
    d = decision("m1", [ranked], refusals)
    d.winner = "w1"
    refusals.append(Refusal(worker="w2", reason="insufficient capacity"))  # appended later
    found = d.explain()
    assert found.winner == "w1" and found.policy == "spread" and found.took_ms == 2.0
    by = {c.worker: c for c in found.candidates}
    assert [c.worker for c in found.candidates] == ["w1", "w2", "w3"]
    assert by["w1"].outcome == "placed" and by["w1"].score == 0.5 and by["w1"].rank == 2
    assert by["w2"].outcome == "refused" and by["w2"].score == 0.9
    assert by["w2"].reason == "insufficient capacity"
    assert by["w3"].outcome == "refused" and by["w3"].score is None
    assert by["w3"].reason == "needs 1 cpus, 0 free"


async def test_a_create_is_explained_to_operators_and_by_the_cli(
    make_cluster: ClusterFactory,
) -> None:
    specs = [
        WorkerSpec("m1", "mad"),
        WorkerSpec("m2", "mad"),
        WorkerSpec("m3", "mad", cpus=1),
        WorkerSpec("a1", "ams"),
    ]
    async with make_cluster(specs) as c:
        op = c.tokens["operator"]
        await ok(await c.call("POST", "/v1/workers/m2/cordon", token=op))
        made = await ok(await c.call("POST", M, json=machine_body(cpus=2)))
        assert made["worker"] == "m1"
        path = f"{M}/{made['id']}/placement"
        found = await ok(await c.call("GET", path, token=op))
        assert found["machine"] == made["id"] and found["winner"] == "m1"
        assert found["region"] == "mad" and found["cpus"] == 2
        by = {x["worker"]: x for x in found["candidates"]}
        assert set(by) == {"m1", "m2", "m3"}  # the region's workers, not ams's
        assert by["m1"]["outcome"] == "placed" and by["m1"]["score"] > 0
        assert by["m2"] == {**by["m2"], "outcome": "refused", "reason": "cordoned"}
        assert by["m3"]["outcome"] == "refused" and "cpu" in by["m3"]["reason"]

        # operators only: an app's own deploy token may not read the fleet's picture
        await err(await c.call("GET", path, token=c.tokens["demo"]), 403)
        body = await err(await c.call("GET", f"{M}/0123456789abcd/placement", token=op), 404)
        assert body["code"] == "not_found"

        # the table in a terminal
        api = str(c.broker.make_url("")).rstrip("/")
        args = ["machines", "why", made["id"], "--app", "demo", "--api", api, "--token", op]
        shown = await asyncio.to_thread(CliRunner().invoke, cli, args)
        assert shown.exit_code == 0, shown.output
        assert "placed on m1" in shown.output
        assert "cordoned" in shown.output and "m3" in shown.output

        # another broker over the same fleet did not place it: it says so
        client = WorkerClient()
        other = Broker(c.fleet, client, Placer(c.fleet, client), registry=None)
        async with TestClient(TestServer(make_app(other, SECRET), host="127.0.0.1")) as second:
            resp = await second.get(path, headers=c.auth(op))
            body = await err(resp, 404)
            assert body["code"] == "not_recorded" and "another broker" in body["error"]
