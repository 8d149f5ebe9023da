"""The catalog across processes over a real nats-server: five workers, two replicas."""

from __future__ import annotations

import asyncio
import contextlib
import json
import sqlite3
import subprocess
import threading
import urllib.error
import urllib.request
from typing import Any

from souk.broker.tokens import mint
from souk.catalog.bus import NatsBus
from souk.catalog.protocol import Batch, Change, changes_subject, encode
from souk.node.cluster_secret import new_secret, read_secret
from tests.support.catalog_cluster import Cluster, ReplicaProcess
from tests.support.nats import flushed
from tests.support.ports import free_port
from tests.support.waiting import wait_until as eventually
from tests.support.worker_process import SOUK, CatalogWorker

SLEEPER = {"init": {"exec": ["sleep", "600"]}, "restart": {"policy": "no"}}


def owners_truth(cluster: Cluster) -> dict[str, tuple[str, str]]:
    """Every machine as its worker holds it: id -> (state, instance id)."""
    truth = {}
    for w in cluster.workers:
        for m in w.ok("GET", "/v1/machines?include_deleted=true"):
            truth[m["id"]] = (m["state"], m["instance_id"])
    return truth


def replica_view(replica: ReplicaProcess) -> dict[str, tuple[str, str]]:
    return {m["id"]: (m["state"], m["instance_id"]) for m in replica.get("/v1/catalog/machines")}


def converged(cluster: Cluster, replica: ReplicaProcess) -> bool:
    return replica_view(replica) == owners_truth(cluster)


def divergence(cluster: Cluster, fresh: ReplicaProcess) -> str:
    """Why `fresh` has not converged: each machine it holds otherwise than its owner, beside what
    an older replica holds, and each owner's head as the owner, the older and the fresh replica
    know it."""
    truth, mine, old = owners_truth(cluster), replica_view(fresh), replica_view(cluster.replicas[0])
    owner_of = {m: w.name for w in cluster.workers for m in w.known_ids()}
    lines = [
        f"{mid} of {owner_of.get(mid)}: owner {truth.get(mid)}, fresh {mine.get(mid)},"
        f" old {old.get(mid)}, seq {machine_seq(cluster, mid)}"
        for mid in sorted(set(truth) | set(mine))
        if truth.get(mid) != mine.get(mid)
    ]
    heads = {
        r.port: {o["owner"]: o for o in r.get("/v1/catalog/status")["owners"]}
        for r in (cluster.replicas[0], fresh)
    }
    for w in cluster.workers:
        o, f = heads[cluster.replicas[0].port].get(w.name, {}), heads[fresh.port].get(w.name, {})
        lines.append(
            f"{w.name}: owner head {owner_head(w)}, old {o.get('head')}/{o.get('announced')},"
            f" fresh {f.get('head')}/{f.get('announced')} epoch {f.get('epoch')}"
        )
    lines.append(f"fresh stats {fresh.get('/v1/catalog/status')['stats']}")
    return "\n".join(lines)


def owner_head(worker: CatalogWorker) -> int:
    """The worker's own head: the last seq of its log, read from its database."""
    return int(_read(worker, "SELECT COALESCE(MAX(seq), 0) FROM oplog")[0])


def machine_seq(cluster: Cluster, mid: str) -> int | None:
    """The machine's version in its worker's database."""
    for w in cluster.workers:
        row = _read(w, "SELECT seq FROM machines WHERE id = ?", (mid,))
        if row is not None:
            return int(row[0])
    return None


def _read(worker: CatalogWorker, sql: str, args: tuple[Any, ...] = ()) -> Any:
    with contextlib.closing(sqlite3.connect(f"file:{worker.db_path}?mode=ro", uri=True)) as db:
        return db.execute(sql, args).fetchone()


def reachable(replica: ReplicaProcess) -> dict[str, bool]:
    return {w["id"]: not w["unreachable"] for w in replica.get("/v1/catalog/workers?all=true")}


def test_every_replica_converges_to_the_owners_rows(cluster: Cluster) -> None:
    ids = []
    for w in cluster.workers:
        for _ in range(3):
            ids.append((w, w.create(SLEEPER)["id"]))
    for w, mid in ids[::4]:
        w.ok("POST", f"/v1/machines/{mid}/stop")
    for w, mid in ids[1::5]:
        w.ok("DELETE", f"/v1/machines/{mid}?force=true")
    for replica in cluster.replicas:
        eventually(lambda r=replica: converged(cluster, r), what="replica converged")  # type: ignore[misc]
        # a worker busy with the burst above may miss a heartbeat, listed again at its next
        eventually(
            lambda r=replica: (
                sorted(  # type: ignore[misc]
                    w["id"] for w in r.get("/v1/catalog/workers?region=ams")
                )
                == ["w1", "w3"]
            ),
            what="both of ams's workers listed",
        )
        assert replica.get("/v1/catalog/apps/demo/regions") == ["ams", "mad"]
    status = cluster.replicas[0].get("/v1/catalog/status")
    assert {o["owner"] for o in status["owners"]} == {w.name for w in cluster.workers}
    assert status["quarantined"] == []


def test_a_killed_worker_is_unreachable_and_its_return_clears_it(cluster: Cluster) -> None:
    victim = cluster.workers[2]
    kept = victim.create(SLEEPER)["id"]
    replica = cluster.replicas[0]
    eventually(lambda: kept in replica_view(replica), what="machine replicated")
    victim.kill9()
    eventually(lambda: not reachable(replica)[victim.name], timeout=10, what="unreachable")
    assert all(up for name, up in reachable(replica).items() if name != victim.name)
    assert kept in replica_view(replica)  # its rows are kept, flagged through its worker
    placeable = [w["id"] for w in replica.get("/v1/catalog/workers")]
    assert victim.name not in placeable
    victim.start()
    eventually(lambda: reachable(replica)[victim.name], timeout=10, what="reachable again")
    eventually(lambda: converged(cluster, replica), what="converged after return")


def test_replicas_serve_stale_rows_while_nats_is_down_then_repair(cluster: Cluster) -> None:
    for w in cluster.workers:
        w.create(SLEEPER)
    for replica in cluster.replicas:
        eventually(lambda r=replica: converged(cluster, r), what="converged before")  # type: ignore[misc]
    before = replica_view(cluster.replicas[0])
    cluster.nats.stop()
    made = [w.create(SLEEPER)["id"] for w in cluster.workers]  # changes nobody can hear now
    assert replica_view(cluster.replicas[0]) == before  # stale, but still answering
    cluster.nats.start()
    for replica in cluster.replicas:
        eventually(lambda r=replica: converged(cluster, r), timeout=20, what="repaired")  # type: ignore[misc]
        assert set(made) <= set(replica_view(replica))


def test_a_new_replica_bootstraps_while_workers_keep_changing(cluster: Cluster) -> None:
    """Whichever replica answers the snapshot request (every worker runs one too, and a worker
    restarted by an earlier test may have caught up from the owners alone), the newcomer ends up
    with every owner's rows, destroyed machines included."""
    stop = threading.Event()

    def churn() -> None:
        while not stop.is_set():
            for w in cluster.workers:
                mid = w.create(SLEEPER)["id"]
                w.ok("DELETE", f"/v1/machines/{mid}?force=true")

    for w in cluster.workers:
        w.create(SLEEPER)
    eventually(lambda: converged(cluster, cluster.replicas[0]), what="first replica")
    worker_threads = [threading.Thread(target=churn)]
    for t in worker_threads:
        t.start()
    try:
        fresh = cluster.add_replica()
    finally:
        stop.set()
        for t in worker_threads:
            t.join()
    # A liveness bound, not a speed: the churn's last batches, pulled as gaps on a loaded host,
    # once took a fresh replica past 15 s.
    try:
        eventually(lambda: converged(cluster, fresh), 45, "fresh replica converged")
    except AssertionError as exc:
        raise AssertionError(f"{exc}\n{divergence(cluster, fresh)}") from None
    assert fresh.get("/v1/catalog/status")["stats"].get("snapshots_loaded") == 1


def test_a_malformed_row_is_quarantined_not_applied(cluster: Cluster) -> None:
    good = cluster.workers[0].create(SLEEPER)
    replica = cluster.replicas[0]
    eventually(lambda: good["id"] in replica_view(replica), what="good row")
    epoch = replica.get("/v1/catalog/workers?region=mad")[0]["epoch"]
    owner = replica.get("/v1/catalog/workers?region=mad")[0]["id"]
    bad_row: dict[str, Any] = {"id": "m-bad", "app": "demo", "state": "on-fire"}
    batch = Batch(owner, "mad", epoch, 0, 1, [Change("machines", "m-bad", 1, bad_row)])
    asyncio.run(_publish(cluster.nats.url, changes_subject("mad", owner), encode(batch)))

    def quarantined() -> list[dict[str, Any]]:
        return list(replica.get("/v1/catalog/status")["quarantined"])

    eventually(lambda: bool(quarantined()), what="quarantined")
    assert quarantined()[0]["key"] == "m-bad"
    assert "m-bad" not in replica_view(replica)
    eventually(lambda: converged(cluster, replica), what="the worker's own rows are intact")
    assert json.dumps(quarantined()[0]["error"])


async def _publish(url: str, subject: str, data: bytes) -> None:
    bus = await NatsBus.connect(url)
    await bus.publish(subject, data)
    await flushed(bus.nc)
    await bus.close()


def test_brokers_place_from_the_catalog_over_nats(cluster: Cluster) -> None:
    """Two stateless brokers, each with its own replica: one holds the app registry, both place
    on the workers they learnt of from the catalog, and see each other's machines."""
    secret = cluster.tmp / "secret"
    secret.write_bytes(new_secret() + b"\n")
    token = mint(read_secret(secret), operator=True)
    first, second = free_port(), free_port()
    common = ["--secret-file", str(secret), "--nats", cluster.nats.url, "--log-level", "warning"]
    procs = [
        subprocess.Popen(
            [
                str(SOUK),
                "broker",
                "--listen",
                f"127.0.0.1:{first}",
                "--app-registry",
                str(cluster.tmp / "registry"),
                *common,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
        subprocess.Popen(
            [
                str(SOUK),
                "broker",
                "--listen",
                f"127.0.0.1:{second}",
                "--app-registry-url",
                f"http://127.0.0.1:{first}",
                *common,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        ),
    ]
    try:
        a, b = (f"http://127.0.0.1:{p}" for p in (first, second))
        eventually(lambda: up(a, token) and up(b, token), 20, "brokers up")
        assert call(b, token, "POST", "/v1/apps", {"name": "shop"})[0] == 201
        made = []
        for url, region in ((a, "ams"), (b, "mad"), (b, "ams")):
            status, body = call(
                url, token, "POST", "/v1/apps/shop/machines", {"region": region, "config": SLEEPER}
            )
            assert status == 200, body
            assert body["region"] == region
            made.append(body["id"])
        for url in (a, b):
            eventually(
                lambda u=url: (
                    {m["id"] for m in call(u, token, "GET", "/v1/apps/shop/machines")[1]}  # type: ignore[misc]
                    == set(made)
                ),
                what="both brokers list every machine",
            )
        status, body = call(
            a, token, "POST", "/v1/apps/shop/machines", {"region": "nowhere", "config": SLEEPER}
        )
        assert status == 400 and body["code"] == "invalid"
    finally:
        for p in procs:
            p.kill()
            p.wait()


def call(base: str, token: str, method: str, path: str, body: Any = None) -> tuple[int, Any]:
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(base + path, data=data, method=method)
    req.add_header("Authorization", f"Bearer {token}")
    req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=10) as resp:
            return resp.status, json.loads(resp.read() or b"null")
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read() or b"null")


def up(base: str, token: str) -> bool:
    try:
        return call(base, token, "GET", "/v1/catalog/workers")[0] == 200
    except OSError:
        return False
