"""The signed catalog on an authenticated bus: a real nats-server configured by `souk nats
config` (mutual TLS, users mapped from certificates, permissions by role), owners signing over
it, and `souk catalog serve` replicas checking signatures."""

from __future__ import annotations

import asyncio
import contextlib
import ssl
import subprocess
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import orjson
import pytest

from souk.catalog.bus import Message, NatsBus, authenticated
from souk.catalog.certs import bus_options, load_signer
from souk.catalog.node import ca_trust
from souk.catalog.owner import Owner
from souk.catalog.protocol import (
    SNAPSHOT,
    Batch,
    Change,
    changes_subject,
    encode,
    heartbeat_subject,
    pull_subject,
    reserve_subject,
)
from souk.catalog.replica import Replica
from souk.catalog.signing import b64
from souk.catalog.sim import SimRows
from souk.models.api import BusReservation, CreateBatch, CreateOutcomes
from souk.models.machine import CreateMachine
from souk.pki import NodeFiles
from souk.worker.daemon import make_driver, running
from souk.worker.engine import Engine
from souk.worker.machines.admission import Fences
from souk.worker.reserving import reserving
from souk.worker.settings import WorkerSettings
from tests.catalog.pki import Ca, NodeCert
from tests.support.catalog import converged
from tests.support.catalog_cluster import ReplicaProcess
from tests.support.nats import NATS, NatsServer, can_connect, flushed
from tests.support.ports import free_port
from tests.support.waiting import eventually as on_the_loop
from tests.support.worker_process import SOUK

pytestmark = pytest.mark.skipif(NATS is None, reason="nats-server is not installed")
NODES = [
    "worker:w1@mad",
    "worker:mad1@mad",
    "worker:w2",
    "broker:b1",
    "operator:cat1",
    "operator:cat2",
]
FUTURE = "ffffffffffffffff-0"


@dataclass
class SecureBus:
    dir: Path
    ca: Ca
    certs: dict[str, NodeCert] = field(default_factory=dict)
    files: dict[str, NodeFiles] = field(default_factory=dict)
    servers: list[NatsServer] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.servers[0].url

    def add(self, role: str, name: str, sans: Sequence[str] = ()) -> None:
        """A node's files, as `souk certs issue --out DIR/NAME` writes them."""
        self.certs[name] = self.ca.node(role, name, sans=sans)
        self.files[name] = self.certs[name].write(self.dir / name)

    def configure(
        self, port: int, nodes: list[str], cluster: Sequence[str] = (), cluster_port: int = 0
    ) -> Path:
        """`souk nats config`, run as an operator would."""
        out = self.dir / f"nats-{port}.conf"
        argv = [
            str(SOUK),
            "nats",
            "config",
            "--tls-dir",
            str(self.dir / "localhost"),
            "--out",
            str(out),
            "--host",
            "127.0.0.1",
            "--port",
            str(port),
            *(a for n in nodes for a in ("--node", n)),
        ]
        if cluster:
            argv += ["--cluster", ",".join(cluster), "--cluster-port", str(cluster_port)]
        subprocess.run(argv, check=True, capture_output=True)
        return out

    async def connect(self, name: str, server: int = 0) -> NatsBus:
        options = bus_options(self.files[name])
        return await NatsBus.connect(self.servers[server].url, name=name, **options)

    def replica(self, name: str, log: str) -> ReplicaProcess:
        security = ["--tls-dir", str(self.dir / name)]
        return ReplicaProcess(self.url, self.dir / log, security=security)


@pytest.fixture(scope="module")
def secure(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SecureBus]:
    bus = SecureBus(tmp_path_factory.mktemp("secure"), Ca())
    bus.add("bus", "localhost", sans=["127.0.0.1"])
    for node in NODES:
        role, _, name = node.partition(":")
        bus.add(role, name.partition("@")[0])
    bus.add("worker", "ghost")  # certified, but not on the bus
    port = free_port()
    bus.servers.append(NatsServer(port, config=bus.configure(port, NODES)))
    bus.servers[0].start()
    try:
        yield bus
    finally:
        for s in bus.servers:
            s.stop()


async def eventually(check: Callable[[], Any], timeout: float = 20.0, what: str = "") -> None:
    deadline = asyncio.get_running_loop().time() + timeout
    while not await asyncio.to_thread(check):
        if asyncio.get_running_loop().time() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what}")
        await asyncio.sleep(0.1)


async def test_only_the_nodes_the_cluster_ca_certified_and_the_bus_names_connect(
    secure: SecureBus,
) -> None:
    def context(files: NodeFiles | None) -> ssl.SSLContext:
        tls = ssl.create_default_context(cafile=str(secure.files["w1"].ca))
        if files is not None:
            tls.load_cert_chain(files.cert, files.key)
        return tls

    stranger = Ca().node("worker", "w1").write(secure.dir / "elsewhere")  # by another CA
    assert await can_connect(secure.url, context(secure.files["w1"]))
    assert not await can_connect(secure.url, None)  # anonymous
    assert not await can_connect(secure.url, context(None))  # TLS, no certificate
    assert not await can_connect(secure.url, context(stranger))
    assert not await can_connect(secure.url, context(secure.files["ghost"]))


@contextlib.asynccontextmanager
async def collecting(bus: NatsBus, *subjects: str) -> AsyncIterator[list[tuple[str, bytes]]]:
    got: list[tuple[str, bytes]] = []

    async def keep(msg: Message) -> None:
        got.append((msg.subject, msg.data))

    subs = [await bus.subscribe(s, keep) for s in subjects]
    await flushed(bus.nc)
    try:
        yield got
    finally:
        for sub in subs:
            await sub.unsubscribe()


async def test_a_worker_publishes_under_its_own_name_only_and_reads_no_rows(
    secure: SecureBus,
) -> None:
    w1, w2, b1 = [await secure.connect(n) for n in ("w1", "w2", "b1")]
    async with (
        collecting(b1, "souk.cat.ch.>", "souk.cat.hb.>", pull_subject("w1")) as broker_got,
        collecting(w1, "souk.cat.ch.>", "souk.cat.hb.>") as worker_got,
    ):
        await w1.publish(changes_subject("mad", "w1"), b"w1's own")
        await w1.publish(changes_subject("ams", "w1"), b"w1, outside its region")
        await w1.publish(changes_subject("mad", "w2"), b"w1 as w2")
        await w1.publish(heartbeat_subject("mad", "mad1"), b"w1 as mad1")
        await w2.publish(heartbeat_subject("ams", "w2"), b"w2's own, any region")
        await b1.publish(changes_subject("mad", "w1"), b"b1 as w1")
        await w2.publish(pull_subject("w1"), b"{}")  # and nobody but w1 reads w1's pulls
        for bus in (w1, w2, b1):
            await flushed(bus.nc)
        await asyncio.sleep(0.5)
    assert sorted(broker_got) == [
        (changes_subject("mad", "w1"), b"w1's own"),
        (heartbeat_subject("ams", "w2"), b"w2's own, any region"),
    ]
    assert worker_got == []
    for bus in (w1, w2, b1):
        await bus.close()


def machines_of(replica: ReplicaProcess) -> dict[str, tuple[str, str]]:
    return {m["id"]: (m["app"], m["state"]) for m in replica.get("/v1/catalog/machines")}


def truth(sources: list[SimRows]) -> dict[str, tuple[str, str]]:
    return {
        c.key: (c.row["app"], c.row["state"])
        for s in sources
        for c in s.rows.values()
        if c.table == "machines" and c.row is not None
    }


async def test_a_signed_catalog_over_the_bus_refuses_every_forgery(secure: SecureBus) -> None:
    sources = [SimRows("w1", "mad"), SimRows("mad1", "mad")]
    buses, owners = [], []
    for src in sources:
        bus = await secure.connect(src.owner)
        owner = Owner(
            bus, src, heartbeat_every=0.2, signer=load_signer(secure.files[src.owner], src.owner)
        )
        src.publisher = owner
        await owner.start()
        buses.append(bus)
        owners.append(owner)
        src.machine("web", key=f"{src.owner}-a")
        src.machine("web", key=f"{src.owner}-b")
    w1 = buses[0]
    replica = secure.replica("cat1", "cat1.log")
    second: ReplicaProcess | None = None
    b1 = await secure.connect("b1")
    try:
        await asyncio.to_thread(replica.start)
        await eventually(lambda: machines_of(replica) == truth(sources), what="converged")
        status = await asyncio.to_thread(replica.get, "/v1/catalog/status")
        assert status["security"] == "signed"
        # beats that overtook the owners' answers to its hello, with their certificates
        assert set(status["refused"]) <= {"unknown_signer"}
        before = status["refused"].get("unknown_signer", 0)

        # The attacks, from a certified worker's connection: the bus refuses what is not under
        # its own name; the replica refuses what is, but claims to be someone else.
        forged_beat = {"owner": "mad1", "region": "mad", "epoch": FUTURE, "head": 0}
        row = SimRows("evil", "mad").worker_row(0).model_dump(mode="json")
        row["address"] = "http://attacker.invalid"
        forged_row = encode(Batch("evil", "mad", "e1", 0, 1, [Change("workers", "evil", 1, row)]))
        await w1.publish(heartbeat_subject("mad", "mad1"), orjson.dumps(forged_beat))
        await w1.publish(heartbeat_subject("mad", "w1"), orjson.dumps(forged_beat))
        await w1.publish(changes_subject("mad", "evil"), forged_row)
        await w1.publish(changes_subject("mad", "w1"), forged_row)
        moved = {**row, "id": "w1"}  # w1 itself, unsigned: as if its key were not in use
        unsigned = Batch("w1", "mad", "e1", 0, 99, [Change("workers", "w1", 99, moved)])
        await w1.publish(changes_subject("mad", "w1"), encode(unsigned))
        await flushed(w1.nc)

        def refused() -> dict[str, int]:
            return dict(replica.get("/v1/catalog/status")["refused"])

        expected = {"wrong_subject": 2, "unsigned": 1} | (
            {"unknown_signer": before} if before else {}
        )
        await eventually(lambda: refused() == expected, what="refused")
        workers = await asyncio.to_thread(replica.get, "/v1/catalog/workers?all=true")
        assert {w["id"]: w["unreachable"] for w in workers} == {"w1": False, "mad1": False}
        assert {w["id"]: w["address"] for w in workers}["w1"] == "http://w1.invalid"
        sources[1].machine("web", key="mad1-c")  # mad1's own messages still count
        await eventually(lambda: machines_of(replica) == truth(sources), what="mad1 still heard")

        # A forged snapshot, from a broker's connection (a replica may answer snapshot requests):
        # a tampered row and proofs stripped. The genuine replica is gone, so it alone answers.
        chunks: list[dict[str, Any]] = []
        async with collecting(b1, inbox := b1.new_inbox()) as got:
            await b1.publish(SNAPSHOT, b'{"regions": null}', reply=inbox)
            await eventually(lambda: bool(got) and orjson.loads(got[-1][1])["last"])
            chunks = [orjson.loads(data) for _, data in got]
        await asyncio.to_thread(replica.stop)
        for chunk in chunks:
            for item in chunk["changes"]:
                if item[0] == "w1" and item[1]["table"] == "machines":
                    item[1]["row"]["app"] = "stolen"
                elif item[0] == "mad1":
                    item[2] = None

        async def forger(msg: Message) -> None:
            for chunk in chunks:
                await b1.publish(msg.reply or "", orjson.dumps(chunk))

        sub = await b1.subscribe(SNAPSHOT, forger)
        await flushed(b1.nc)
        second = secure.replica("cat2", "cat2.log")
        await asyncio.to_thread(second.start)
        await sub.unsubscribe()
        status = await asyncio.to_thread(second.get, "/v1/catalog/status")
        assert status["stats"]["snapshots_loaded"] == 1
        assert status["refused"]["bad_signature"] >= 1 and status["refused"]["unsigned"] >= 1
        await eventually(lambda: machines_of(second) == truth(sources), what="pulled instead")
    finally:
        for r in (replica, second):
            if r is not None:
                await asyncio.to_thread(r.stop)
        for owner in owners:
            await owner.stop()
        for bus in [*buses, b1]:
            await bus.close()


async def test_a_forged_batch_on_an_owners_own_subject_fails_its_audit_and_is_pulled_again(
    secure: SecureBus,
) -> None:
    """What a compromised nats-server would deliver, published here by the owner's own
    connection (the bus lets it): a batch on w1's subject whose signature does not fit."""
    src = SimRows("w1", "mad")
    w1 = await secure.connect("w1")
    owner = Owner(w1, src, heartbeat_every=0.2, signer=load_signer(secure.files["w1"], "w1"))
    src.publisher = owner
    await owner.start()
    cat = await secure.connect("cat1")
    assert authenticated(cat)
    replica = Replica(cat, trust=ca_trust(secure.files["cat1"]), audit_rate=0.0)
    try:
        await replica.start(bootstrap=False)
        real = src.machine("web", key="w1-a")
        await on_the_loop(lambda: converged(replica, [src]))
        replica.audit.rate = 1.0
        row = {**(real.row or {}), "app": "stolen"}
        forged = Batch("w1", "mad", src.epoch, src.seq, src.seq + 5, [])
        forged.changes = [Change("machines", "w1-a", src.seq + 5, row)]
        forged.fp = owner.signer.fingerprint if owner.signer else ""
        forged.sig = b64(b"\0" * 64)
        await w1.publish(changes_subject("mad", "w1"), encode(forged))
        await flushed(w1.nc)
        await on_the_loop(lambda: replica.stats["repulled"] == 1)
        assert replica.stats["audit_failures"] == 1
        assert dict(replica.guard.refused) == {"bad_signature": 1}
        assert converged(replica, [src])
        machine = replica.machine("w1-a")
        assert machine is not None and machine.app == "web"
    finally:
        await replica.stop()
        await owner.stop()
        await cat.close()
        await w1.close()


async def test_servers_in_a_cluster_route_over_tls(secure: SecureBus) -> None:
    a, b, ra, rb = free_port(), free_port(), free_port(), free_port()
    nodes = ["worker:w1@mad", "broker:b1"]
    servers = [
        NatsServer(a, config=secure.configure(a, nodes, [f"nats-route://localhost:{rb}"], ra)),
        NatsServer(b, config=secure.configure(b, nodes, [f"nats-route://localhost:{ra}"], rb)),
    ]
    clustered = SecureBus(secure.dir, secure.ca, secure.certs, secure.files)
    clustered.servers = servers
    for s in servers:
        s.start()
    try:
        w1, b1 = await clustered.connect("w1", 0), await clustered.connect("b1", 1)
        async with collecting(b1, "souk.cat.ch.>") as got:
            for _ in range(100):  # until the route is up
                await w1.publish(changes_subject("mad", "w1"), b"across")
                await flushed(w1.nc)
                await asyncio.sleep(0.1)
                if got:
                    break
        assert got and got[0] == (changes_subject("mad", "w1"), b"across")
        await w1.close()
        await b1.close()
    finally:
        for s in servers:
            s.stop()


async def test_only_a_broker_reserves_on_a_workers_subject_and_only_it_answers(
    secure: SecureBus, tmp_path: Path
) -> None:
    """A secured worker takes reservations on its subject of the authenticated bus: a broker's
    is answered with the machine; another worker's never reaches it (the bus's permissions are
    the proof NATS core gives, as the certificate's role is over HTTPS), and no machine is made."""
    w1, w2, b1 = [await secure.connect(n) for n in ("w1", "w2", "b1")]
    settings = WorkerSettings(
        name="w1", region="mad", data_dir=tmp_path / "w1", cpus=4, memory_mb=4096, durable=False
    )
    async with (
        running(Engine(settings, make_driver("sim", settings))) as engine,
        reserving(engine, Fences(), w1, secure=True) as answering,
    ):
        assert answering
        await flushed(w1.nc)
        create = CreateMachine.model_validate(
            {"id": "0123456789abcd", "app": "demo", "config": {"image": "busybox"}}
        )
        body = BusReservation(batch=CreateBatch(machines=[create]), hold=30).model_dump_json()
        with pytest.raises(TimeoutError):
            await w2.request(reserve_subject("w1"), body.encode(), timeout=1.0)
        assert engine.capacity().machines == 0
        answer = CreateOutcomes.model_validate_json(
            await b1.request(reserve_subject("w1"), body.encode(), timeout=5.0)
        )
        assert [o.status for o in answer.outcomes] == [201]
        assert engine.get("0123456789abcd").app == create.app
    for bus in (w1, w2, b1):
        await bus.close()
