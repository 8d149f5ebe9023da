"""How a broker's CPU per operation grows with the fleet: 10, 100, 1,000 and 10,000 workers.

In one process, no network: a catalog replica (SQLite in a file, as in production) is handed the
messages that N simulated owners (`SimRows`) publish, one at a time, and a `Placer` over
`CatalogFleet` takes catalog-strategy decisions on what it holds. CPU time (`process_time`) per
operation, which a busy shared host blurs far less than wall-clock figures, for each part of a
broker's work:

- heartbeat: one owner's heartbeat that brings no news (1,000 a second at 1,000 workers);
- batch: one worker row changed (what every reservation makes its worker publish);
- decision: the catalog strategy's decision (the region's placeable rows, one slice of them
  filtered into candidates, ranked), and in the same run the same decision reading the region
  afresh as before (`before`: every reachable row filtered on every create, every row copied once
  a second to find the silent ones);
- image decision: the same for a create naming an image that one worker in a hundred holds
  (those workers join the slice, found through the replica's images), and in the same run as
  it was before: the whole region ranked, each worker's images looked through;
- request + response: a create's body parsed and validated, and the machine it answers
  serialized.

From these, the broker's idle CPU (its heartbeats: % of one core per 1,000 workers) and the
marginal CPU of a placement (decision, request and answer, a row change) are modelled; with
`--placement FILE` (`bench/placement.py --json`), the idle and marginal CPU that benchmark
measured end to end, plain and secured, are drawn beside them, up to 10,000 workers.

Signed (each owner with its own Ed25519 key and certificate, the replica checking against the
CA), heartbeats and batches are measured again, up to `--signed-up-to` owners (issuing a
certificate per owner is what limits it). The decision's wall-clock p99 is reported too.

    .venv/bin/python bench/fleet_curves.py                       # about a minute
    .venv/bin/python bench/fleet_curves.py --plot docs/images    # and the PNG charts
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from rich.console import Console
from rich.table import Table

from _harness import Series, chart, pct

from souk.broker.fleet import CatalogFleet
from souk.broker.placement.pipeline import Placer
from souk.broker.placement.stages import candidates, rank, with_cached_image
from souk.catalog.bus import InProcessBus, Message
from souk.catalog.index.images import ImageIndex
from souk.catalog.index.workers import WorkerIndex
from souk.catalog.owner import Owner
from souk.catalog.replica import Replica
from souk.catalog.sim import SimRows
from souk.clients.workers import WorkerClient
from souk.models.api import CreateMachineRequest
from souk.models.machine import CreateMachine, GuestConfig, Machine
from tests.catalog.pki import Ca

REGION = "bench"
GOAL_MARGINAL_MS = 0.3  # as bench/placement.py's goals
GOAL_IDLE_PER_1000 = 3.0
BODY = json.dumps(
    {
        "region": REGION,
        "config": {"init": {"exec": ["true"]}, "guest": {"cpus": 1, "memory_mb": 256}},
    }
).encode()
GUEST = GuestConfig(cpus=1, memory_mb=256)
IMAGE = "registry.example/web:1"  # cached by one worker in `HOLDERS_EVERY`
IMAGE_DIGEST = "sha256:" + "ab" * 32
HOLDERS_EVERY = 100


class RecordingBus(InProcessBus):
    """Keeps what owners publish, to hand it to a replica one message at a time."""

    def __init__(self) -> None:
        super().__init__()
        self.kept: list[Message] = []

    async def publish(self, subject: str, data: bytes, reply: str | None = None) -> None:
        self.kept.append(Message(subject, data, reply))


@dataclass
class Recorded:
    start: list[Message]  # each owner's worker row and first heartbeat
    batches: list[Message]  # one worker row change each
    beats: list[Message]  # heartbeats that bring no news


async def record(n: int, changes: int, beats: int, ca: Ca | None) -> Recorded:
    bus = RecordingBus()
    owners: list[tuple[SimRows, Owner]] = []
    for i in range(n):
        src = SimRows(f"w{i:05d}", REGION, cpus=1000)
        signer = ca.node("worker", src.owner).signer() if ca is not None else None
        owner = Owner(bus, src, heartbeat_every=3600, signer=signer)
        owner.published = 0
        if i % HOLDERS_EVERY == 0:
            row = {"worker_id": src.owner, "digest": IMAGE_DIGEST, "ref": IMAGE, "size": 1}
            src.put("images", IMAGE_DIGEST, row)
        await owner._publish(src.seq, list(src.rows.values()))
        await owner.heartbeat(with_cert=True)
        owners.append((src, owner))
    start = len(bus.kept)
    rng = random.Random(1)
    for _ in range(changes):
        src, owner = owners[rng.randrange(n)]
        reserved = rng.randrange(100)
        change = src.put("workers", src.owner, src.worker_row(reserved).model_dump(mode="json"))
        await owner._publish(src.seq, [change])
    middle = len(bus.kept)
    for i in range(beats):
        await owners[i % n][1].heartbeat()
    return Recorded(bus.kept[:start], bus.kept[start:middle], bus.kept[middle:])


@dataclass
class Size:
    workers: int
    mode: str  # plain, signed, or audited (signed, on a bus that vouches for subjects)
    heartbeat_us: float
    batch_us: float
    decision_us: float | None = None
    decision_before_us: float | None = None
    decision_p99_ms: float | None = None
    decision_before_p99_ms: float | None = None
    request_us: float | None = None
    sqlite_per_beat: float = 0.0  # statements a heartbeat without news runs
    image_decision_us: float | None = None  # a create naming an image 1% of workers hold
    image_decision_before_us: float | None = None  # the same, ranking the whole region

    @property
    def idle_per_1000(self) -> float:
        """The broker's CPU with no creates, as modelled here: one heartbeat a second from each
        worker, in % of one core per 1,000 workers."""
        return self.heartbeat_us * 1000 / 1e6 * 100

    @property
    def marginal_ms(self) -> float | None:
        """What a placement adds to the broker's CPU, as modelled here: its decision, its
        request and answer, and one worker row change applied (no HTTP, no TLS, no reservation
        round trip: `bench/placement.py` measures the whole of it)."""
        if self.decision_us is None or self.request_us is None:
            return None
        return (self.decision_us + self.request_us + self.batch_us) / 1000


def cpu_per(fn: Callable[[], Any], rounds: int) -> tuple[float, list[float]]:
    """CPU µs per call, and each call's wall-clock seconds."""
    walls = []
    c0 = time.process_time()
    for _ in range(rounds):
        t = time.perf_counter()
        fn()
        walls.append(time.perf_counter() - t)
    return 1e6 * (time.process_time() - c0) / rounds, walls


async def one_size(n: int, mode: str, workdir: Path, rounds: int) -> Size:
    """`mode`: plain, signed (every batch checked), or audited (signed, on a bus that vouches
    for who published on an owner's subject, as the authenticated bus does)."""
    signed = mode != "plain"
    ca = Ca() if signed else None
    rec = await record(n, rounds, max(rounds, n), ca)
    path = workdir / f"replica-{n}-{mode}.db"
    # every owner stays reachable however long the recording and replay take on a busy host
    replica = Replica(
        InProcessBus(authenticated=mode == "audited"),
        path,
        unreachable_after=3600,
        trust=ca.trust() if ca else None,
    )
    await replica.start(bootstrap=False)
    for msg in rec.start:
        on_batch, on_beat = replica.batches.on_batch, replica.heartbeats.on_beat
        await (on_batch if ".ch." in msg.subject else on_beat)(msg)
    replica._flush()

    statements: list[str] = []
    replica.store.conn.set_trace_callback(statements.append)
    c0 = time.process_time()
    for msg in rec.beats:
        await replica.heartbeats.on_beat(msg)
        replica._flush()
    beat_us = 1e6 * (time.process_time() - c0) / len(rec.beats)
    sqlite_per_beat = len(statements) / len(rec.beats)
    replica.store.conn.set_trace_callback(None)

    c0 = time.process_time()
    for msg in rec.batches:
        await replica.batches.on_batch(msg)
        replica._flush()  # one commit per batch: the most a replica pays
    batch_us = 1e6 * (time.process_time() - c0) / len(rec.batches)
    if sum(replica.guard.refused.values()) or replica.stats["gaps"]:
        raise SystemExit(f"the replay went wrong: {dict(replica.guard.refused)}")
    size = Size(n, mode, beat_us, batch_us)
    size.sqlite_per_beat = sqlite_per_beat
    if not signed:
        decide(size, replica, rounds)
    await replica.stop()
    return size


def decide(size: Size, replica: Replica, rounds: int) -> None:
    fleet = CatalogFleet(replica, None)
    placer = Placer(fleet, WorkerClient(), rng=random.Random(2))
    rng = random.Random(3)

    def decision() -> None:
        reachable, _ = placer.usable(REGION)
        rows = next(candidates(reachable, "catalog", placer.sample, rng))
        rank(placer.eligible(rows, GUEST).candidates, GUEST, rng=rng)

    every = [0]

    def before() -> None:  # the same, reading the region as it was read before
        held = replica.indexes.of(WorkerIndex).in_region[REGION].values()
        reachable = [w for w in held if replica.reachable(w.id)]
        every[0] += 1
        if every[0] % 200 == 0:  # the copy of every row, once a second at 200 creates/s
            replica.workers(region=REGION, reachable_only=False)
        start = rng.randrange(len(reachable))
        order = reachable[start:] + reachable[:start]
        rows = order[: placer.sample]
        rank(placer.eligible(rows, GUEST).candidates, GUEST, rng=rng)

    if len(replica.placeable(REGION)) != size.workers:
        raise SystemExit(f"the replica holds {len(replica.placeable(REGION))} placeable workers")
    decision()  # the placeable rows and the candidates, built once as in a running broker
    before()
    size.decision_us, walls = cpu_per(decision, rounds)
    size.decision_p99_ms = pct(walls, 99)
    size.decision_before_us, walls = cpu_per(before, rounds)
    size.decision_before_p99_ms = pct(walls, 99)

    def image_decision() -> None:
        reachable, _ = placer.usable(REGION)
        holding = placer.holding(REGION, IMAGE)
        rows = next(candidates(reachable, "catalog", placer.sample, rng, holding=holding))
        cands = placer.eligible(rows, GUEST).candidates
        rank(with_cached_image(cands, {w.id for w in holding}), GUEST, rng=rng)

    def image_before() -> None:  # as it was: the whole region, each worker's images asked
        reachable, _ = placer.usable(REGION)
        cands = placer.eligible(reachable, GUEST).candidates
        images = replica.indexes.of(ImageIndex).rows
        cached = [
            replace(c, image_cached=True)
            if any(row.ref == IMAGE for row in images.get(c.worker, {}).values())
            else c
            for c in cands
        ]
        rank(cached, GUEST, rng=rng)

    size.image_decision_us, _ = cpu_per(image_decision, rounds)
    size.image_decision_before_us, _ = cpu_per(image_before, max(10, rounds // 20))

    machine = None

    def request() -> None:
        nonlocal machine
        body = CreateMachineRequest.model_validate_json(BODY)
        create = CreateMachine(app="bench", config=body.config, start=not body.skip_launch)
        if machine is None:
            machine = Machine(
                id="0123456789abcd",
                name="bench",
                app="bench",
                worker="w00000",
                region=REGION,
                config=create.config,
                state="created",
                instance_id="i1",
                created_at="2026-01-01T00:00:00Z",
                updated_at="2026-01-01T00:00:00Z",
            )
        machine.model_dump_json()

    size.request_us, _ = cpu_per(request, rounds)


@dataclass
class Report:
    machine: str
    sizes: list[Size] = field(default_factory=list)


async def measure(args: argparse.Namespace, console: Console) -> Report:
    from _harness import machine_info

    report = Report(machine_info())
    with tempfile.TemporaryDirectory(prefix="souk-bench-") as tmp:
        for n in args.sizes:
            for mode in ("plain", "signed", "audited"):
                if mode != "plain" and n > args.signed_up_to:
                    continue
                console.print(f"{n:>6} workers, {mode}", style="dim")
                report.sizes.append(await one_size(n, mode, Path(tmp), args.rounds))
    return report


def table(report: Report) -> Table:
    t = Table(title="a broker's CPU per operation (µs), by fleet size, in one run")
    for col in (
        "workers", "mode", "heartbeat", "SQLite stmts / beat", "batch",
        "decision", "decision before", "decision p99 ms (before)", "image decision (before)",
        "request + response", "idle %/1,000 workers", "marginal ms",
    ):  # fmt: skip
        t.add_column(col, justify="right")
    plain = {s.workers: s for s in report.sizes if s.mode == "plain"}

    def vs(v: float, base: float) -> str:
        return f"{v:.1f} ({v / base:.2f}x)"

    for s in report.sizes:
        base = plain[s.workers]
        signed = s.mode != "plain"
        t.add_row(
            f"{s.workers:,}", s.mode,
            vs(s.heartbeat_us, base.heartbeat_us) if signed else f"{s.heartbeat_us:.1f}",
            f"{s.sqlite_per_beat:.2f}",
            vs(s.batch_us, base.batch_us) if signed else f"{s.batch_us:.1f}",
            "" if s.decision_us is None else f"{s.decision_us:.1f}",
            "" if s.decision_before_us is None else f"{s.decision_before_us:.1f}",
            "" if s.decision_p99_ms is None
            else f"{s.decision_p99_ms:.3f} ({s.decision_before_p99_ms:.3f})",
            "" if s.image_decision_us is None
            else f"{s.image_decision_us:.1f} ({s.image_decision_before_us:.1f})",
            "" if s.request_us is None else f"{s.request_us:.1f}",
            f"{s.idle_per_1000:.2f}",
            "" if s.marginal_ms is None else f"{s.marginal_ms:.3f}",
        )  # fmt: skip
    return t


def measured(placement: Path | None) -> dict[str, list[tuple[int, float, float]]]:
    """From `bench/placement.py --json` (catalog strategy): per mode, (workers, idle % of a core
    per 1,000 workers, marginal ms per placement), by fleet size."""
    if placement is None:
        return {}
    rows = json.loads(placement.read_text())["rows"]
    out: dict[str, list[tuple[int, float, float]]] = {}
    for r in sorted(rows, key=lambda r: r["workers"]):
        if r["strategy"] == "catalog" and r.get("broker_idle_pct"):
            idle = r["broker_idle_pct"] * 1000 / r["workers"]
            out.setdefault(r["mode"], []).append((r["workers"], idle, r["marginal_ms"]))
    return out


def broker_charts(report: Report, into: Path, placement: Path | None) -> list[Path]:
    """The broker's idle CPU per 1,000 workers and its marginal CPU per placement by fleet
    size: modelled here (the catalog's and the decision's parts), and as `bench/placement.py`
    measured them end to end (plain and secured), against their goals."""
    plain = [s for s in report.sizes if s.mode == "plain"]
    xs = [s.workers for s in plain]
    idle: Series = [("modelled: heartbeats", xs, [s.idle_per_1000 for s in plain], "^--")]
    marginal: Series = [
        ("modelled: decision + request + a row change", xs, [s.marginal_ms or 0.0 for s in plain],
         "o--"),
    ]  # fmt: skip
    for mode, points in measured(placement).items():
        px = [p[0] for p in points]
        idle.append((f"measured, {mode}", px, [p[1] for p in points], "s-"))
        marginal.append((f"measured, {mode}", px, [p[2] for p in points], "s-"))
    span = [min(xs), max(xs)]
    idle.append(("goal", span, [GOAL_IDLE_PER_1000] * 2, "k:"))
    marginal.append(("goal", span, [GOAL_MARGINAL_MS] * 2, "k:"))
    return [
        chart(
            idle,
            "workers in the region",
            "% of one core per 1,000 workers",
            "Broker CPU with no creates",
            into / "broker-idle-cpu.png",
        ),
        chart(
            marginal,
            "workers in the region",
            "ms of CPU per placement",
            "Broker CPU a placement adds",
            into / "broker-marginal-cpu.png",
        ),
    ]


def plot(report: Report, into: Path, placement: Path | None = None) -> list[Path]:
    into.mkdir(parents=True, exist_ok=True)
    plain = [s for s in report.sizes if s.mode == "plain"]
    signed = [s for s in report.sizes if s.mode == "signed"]
    xs = [s.workers for s in plain]
    broker: Series = [
        ("decision (catalog strategy)", xs, [s.decision_us or 0.0 for s in plain], "o-"),
        (
            "decision, region read as before",
            xs,
            [s.decision_before_us or 0.0 for s in plain],
            "o--",
        ),
        (
            "decision naming an image 1% hold",
            xs,
            [s.image_decision_us or 0.0 for s in plain],
            "v-",
        ),
        (
            "decision naming an image, whole region as before",
            xs,
            [s.image_decision_before_us or 0.0 for s in plain],
            "v--",
        ),
        ("one worker row change applied", xs, [s.batch_us for s in plain], "s-"),
        ("one heartbeat without news", xs, [s.heartbeat_us for s in plain], "^-"),
        ("create request parsed + answer", xs, [s.request_us or 0.0 for s in plain], "d-"),
    ]
    sx = [s.workers for s in signed]
    audited = [s for s in report.sizes if s.mode == "audited"]
    ax = [s.workers for s in audited]
    by = {s.workers: s for s in plain}
    catalog: Series = [
        ("batch, plain", sx, [by[s.workers].batch_us for s in signed], "s-"),
        ("batch, signed", sx, [s.batch_us for s in signed], "s--"),
        ("heartbeat, plain", sx, [by[s.workers].heartbeat_us for s in signed], "^-"),
        ("heartbeat, signed", sx, [s.heartbeat_us for s in signed], "^--"),
        ("batch, signed, on the bus's word (audited)", ax, [s.batch_us for s in audited], "s:"),
    ]
    return [
        chart(
            broker,
            "workers in the region (owners followed)",
            "broker CPU per operation (µs)",
            "Broker CPU per operation as the fleet grows",
            into / "broker-cpu-per-operation.png",
        ),
        chart(
            catalog,
            "owners followed",
            "replica CPU per message (µs)",
            "Catalog replica: plain against signed",
            into / "catalog-cpu-signed.png",
        ),
        *broker_charts(report, into, placement),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--sizes", default="10,100,1000,10000")
    parser.add_argument("--rounds", type=int, default=2000, help="operations per part")
    parser.add_argument("--signed-up-to", type=int, default=1000)
    parser.add_argument("--plot", type=Path, help="write the PNG charts into this directory")
    parser.add_argument(
        "--placement",
        type=Path,
        help="`bench/placement.py --json` output: its measured idle and marginal broker CPU, plain"
        " and secured, drawn with the modelled ones",
    )
    parser.add_argument("--json", action="store_true")
    parser.add_argument(
        "--from", dest="source", type=Path, help="plot a report this script wrote with --json"
    )
    args = parser.parse_args()
    args.sizes = [int(s) for s in args.sizes.split(",")]
    err = Console(stderr=True)
    if args.source is not None:
        loaded = json.loads(args.source.read_text())
        report = Report(loaded["machine"], [Size(**s) for s in loaded["sizes"]])
    else:
        report = asyncio.run(measure(args, err))
    if args.json:
        print(json.dumps(asdict(report), indent=2))
    else:
        out = Console(width=max(Console().width, 150))
        out.print(f"machine: {report.machine}")
        out.print(table(report))
    if args.plot is not None:
        for path in plot(report, args.plot, args.placement):
            err.print(f"wrote {path}")


if __name__ == "__main__":
    main()
