"""A bounded soak on the namespace bed (`scripts/soak.sh`): clients create and destroy machines
through every broker while a schedule of faults (kill -9 of any part, partitions, asymmetric and
flapping links) runs against the fleet. After each fault the fleet is healed and the time until
every broker's picture equals the workers' is measured; at the end every worker is asked what
it holds, and the audit counts what a client would hold against souk:

- lost: a machine a client was told about (create answered 200, never destroyed) that no worker
  has;
- duplicated: a machine id held by two workers, or run by two processes;
- orphaned: a machine, or a machine's process, that no client was told about, once the
  settling time (longer than the worker's provisional hold and the broker's cleanup) is over;
- overcommitted: a worker whose reservations exceed what it offers.

Clients retry a create whose answer they lost (a transport error, a 5xx) with the same
Idempotency-Key, as a careful client does; a create never answered is counted as such, and
whatever it made must be gone by the end (or it is an orphan)."""

from __future__ import annotations

import json
import os
import random
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fleet.parts import BrokerNode, Fleet, NatsNode, WorkerNode, eventually

APP = "soak"
RETRIES = 4  # attempts per create with one idempotency key
MACHINE_ENV = b"SOUK_MACHINE_ID="


@dataclass
class Ledger:
    """What clients were told, shared by the load threads."""

    acked: set[str] = field(default_factory=set)
    destroyed: set[str] = field(default_factory=set)
    unanswered: int = 0  # creates given up after RETRIES attempts with no answer
    statuses: Counter[int] = field(default_factory=Counter)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def live(self) -> set[str]:
        with self.lock:
            return self.acked - self.destroyed


@dataclass
class Round:
    kind: str  # a key of FAULTS
    fault: str  # what exactly, with the parts it hit
    held: float
    converged_in: float | None  # None: not within the bound


@dataclass
class Report:
    minutes: float
    rounds: list[Round]
    acked: int
    destroyed: int
    unanswered: int
    statuses: dict[int, int]
    lost: list[str]
    duplicated: list[str]
    orphaned: list[str]
    overcommitted: list[str]

    @property
    def clean(self) -> bool:
        return not (self.lost or self.duplicated or self.orphaned or self.overcommitted)

    def as_json(self) -> dict[str, Any]:
        out = dict(self.__dict__)
        out["rounds"] = [r.__dict__ for r in self.rounds]
        return out


class Load:
    """Client threads: each creates a machine through a random broker in a random region, and
    now and then destroys one it was told about. `paused()` lets the in-flight calls end and
    holds new ones, so that convergence is measured on a fleet at rest."""

    def __init__(self, fleet: Fleet, ledger: Ledger, seed: int, threads: int = 3) -> None:
        self.fleet, self.ledger = fleet, ledger
        self.regions = sorted({w.region for w in fleet.workers})
        self.rngs = [random.Random(seed * 100 + i) for i in range(threads)]
        self.stop = threading.Event()
        self.go = threading.Event()
        self.go.set()
        self.busy = [threading.Event() for _ in range(threads)]
        self.pool = ThreadPoolExecutor(threads)
        self.runs = [self.pool.submit(self._run, i) for i in range(threads)]

    def _run(self, i: int) -> None:
        rng = self.rngs[i]
        while not self.stop.is_set():
            self.go.wait()
            if self.stop.is_set():
                break
            self.busy[i].set()
            try:
                live = sorted(self.ledger.live())
                if live and rng.random() < 0.3:
                    self._destroy(rng, rng.choice(live))
                else:
                    self._create(rng)
            finally:
                self.busy[i].clear()
            time.sleep(rng.uniform(0.05, 0.2))

    def _create(self, rng: random.Random) -> None:
        key = uuid.uuid4().hex
        region = rng.choice(self.regions)
        for _ in range(RETRIES):
            broker = rng.choice(self.fleet.brokers)
            try:
                status, body = broker.create(APP, region, timeout=10, key=key)
            except OSError:
                time.sleep(0.5)
                continue
            with self.ledger.lock:
                self.ledger.statuses[status] += 1
                if status == 200:
                    self.ledger.acked.add(str(body["id"]))
                    return
            if status < 500:
                return  # a clear refusal (412 no capacity...): nothing was made
            time.sleep(0.5)
        with self.ledger.lock:
            self.ledger.unanswered += 1

    def _destroy(self, rng: random.Random, mid: str) -> None:
        broker = rng.choice(self.fleet.brokers)
        try:
            status, _ = broker.api("DELETE", f"/v1/apps/{APP}/machines/{mid}?force=true")
        except OSError:
            return
        if status in (200, 404):
            with self.ledger.lock:
                self.ledger.destroyed.add(mid)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self.go.clear()
        eventually(lambda: not any(b.is_set() for b in self.busy), 60, "in-flight calls end")
        try:
            yield
        finally:
            self.go.set()

    def close(self) -> None:
        self.stop.set()
        self.go.set()
        for run in self.runs:
            run.result()
        self.pool.shutdown()


# --- faults ------------------------------------------------------------------------------------
# Each takes the fleet, a random source and how long to hold the fault; it returns its name once
# the fault is over (parts restarted, links healed).


def _restart(part: WorkerNode | BrokerNode | NatsNode, held: float) -> None:
    part.kill()
    time.sleep(held)
    part.start()


def kill_worker(fleet: Fleet, rng: random.Random, held: float) -> str:
    w = rng.choice(fleet.workers)
    _restart(w, held)
    return f"kill -9 {w.host}"


def kill_broker(fleet: Fleet, rng: random.Random, held: float) -> str:
    b = rng.choice(fleet.brokers)
    _restart(b, held)
    return f"kill -9 {b.host}"


def kill_nats(fleet: Fleet, rng: random.Random, held: float) -> str:
    n = rng.choice(fleet.nats)
    _restart(n, held)
    eventually(fleet.cluster_formed, 30, "the nats cluster's routes")
    return f"kill -9 {n.host}"


def worker_off_bus(fleet: Fleet, rng: random.Random, held: float) -> str:
    w = rng.choice(fleet.workers)
    with fleet.bed.dropping(w.host, [n.host for n in fleet.nats]):
        time.sleep(held)
    return f"{w.host} cut from the bus"


def region_off_bus(fleet: Fleet, rng: random.Random, held: float) -> str:
    region = rng.choice(sorted({w.region for w in fleet.workers}))
    hosts = [w.host for w in fleet.workers if w.region == region]
    with fleet.bed.dropping(hosts, [n.host for n in fleet.nats]):
        time.sleep(held)
    return f"region {region} cut from the bus"


def broker_off_worker(fleet: Fleet, rng: random.Random, held: float) -> str:
    b, w = rng.choice(fleet.brokers), rng.choice(fleet.workers)
    with fleet.bed.dropping(b.host, w.host):
        time.sleep(held)
    return f"{b.host} cut from {w.host}"


def worker_off_everyone(fleet: Fleet, rng: random.Random, held: float) -> str:
    w = rng.choice(fleet.workers)
    fleet.bed.link_down(w.host)
    try:
        time.sleep(held)
    finally:
        fleet.bed.link_up(w.host)
    return f"{w.host}'s link down"


def asymmetric(fleet: Fleet, rng: random.Random, held: float) -> str:
    b, w = rng.choice(fleet.brokers), rng.choice(fleet.workers)
    with fleet.bed.dropping(w.host, b.host, one_way=True):
        time.sleep(held)
    return f"{w.host} -> {b.host} dropped (one way)"


def flapping(fleet: Fleet, rng: random.Random, held: float) -> str:
    w = rng.choice(fleet.workers)
    flap = fleet.bed.flap(w.host, down_for=0.5, up_for=0.5)
    try:
        time.sleep(held)
    finally:
        flap.stop()
        fleet.bed.link_up(w.host)
    return f"{w.host}'s link flapping"


Fault = Callable[[Fleet, random.Random, float], str]
FAULTS: dict[str, Fault] = {
    "kill-worker": kill_worker,
    "kill-broker": kill_broker,
    "kill-nats": kill_nats,
    "worker-off-bus": worker_off_bus,
    "region-off-bus": region_off_bus,
    "broker-off-worker": broker_off_worker,
    "worker-off-everyone": worker_off_everyone,
    "asymmetric": asymmetric,
    "flapping": flapping,
}


# --- the run -------------------------------------------------------------------------------------


def soak(
    fleet: Fleet,
    *,
    minutes: float | None = None,
    rounds: int | None = None,
    faults: list[str] | None = None,
    seed: int = 1,
    hold: tuple[float, float] = (2.0, 6.0),
    converge_within: float = 60.0,
    settle: float = 75.0,
    progress: Callable[[str], None] = print,
) -> Report:
    """Faults from `faults` (all by default) in a seeded random order until `minutes` have
    passed or `rounds` faults were run, under load; then the audit."""
    names = faults or list(FAULTS)
    unknown = set(names) - set(FAULTS)
    if unknown:
        raise ValueError(f"unknown faults {sorted(unknown)}; known: {', '.join(FAULTS)}")
    rng = random.Random(seed)
    status, body = fleet.broker.api("POST", "/v1/apps", {"name": APP})
    assert status in (201, 409), body
    ledger = Ledger()
    started = time.monotonic()
    done: list[Round] = []
    load = Load(fleet, ledger, seed)
    try:
        while (rounds is None or len(done) < rounds) and (
            minutes is None or time.monotonic() - started < minutes * 60
        ):
            held, kind = rng.uniform(*hold), rng.choice(names)
            what = FAULTS[kind](fleet, rng, held)
            ended = time.monotonic()  # the fault is over: parts back, links healed
            with load.paused():
                converged_in = _converge(fleet, ended, converge_within)
            done.append(Round(kind, what, round(held, 1), converged_in))
            took = "not converged" if converged_in is None else f"converged in {converged_in} s"
            with ledger.lock:
                acked, lost_answers = len(ledger.acked), ledger.unanswered
            progress(
                f"[{_clock(time.monotonic() - started)}] {what} for {held:.1f} s: {took}; "
                f"{acked} acknowledged, {lost_answers} never answered"
            )
    finally:
        load.close()
    progress(f"settling {settle:.0f} s (provisional holds and cleanups run out), then the audit")
    fleet.bed.heal()
    time.sleep(settle)
    return _audit(fleet, ledger, done, (time.monotonic() - started) / 60)


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60):02d}:{int(seconds % 60):02d}"


def _converge(fleet: Fleet, t0: float, within: float) -> float | None:
    """Seconds from `t0` (the fault's end) until every broker's picture is the workers'."""
    try:
        for broker in fleet.brokers:
            eventually(lambda b=broker: fleet.converged(b), within, f"{broker.host} converges")  # type: ignore[misc]
    except AssertionError:
        return None
    return round(time.monotonic() - t0, 2)


def _audit(fleet: Fleet, ledger: Ledger, done: list[Round], minutes: float) -> Report:
    holders: dict[str, list[str]] = {}
    for w in fleet.workers:
        for m in w.machines():
            if m["app"] == APP:
                holders.setdefault(m["id"], []).append(w.host)
    processes = Counter(mid for w in fleet.workers for mid in _machine_processes(fleet, w))
    live = ledger.live()
    with ledger.lock:
        told = set(ledger.acked)
    overcommitted = []
    for w in fleet.workers:
        status, cap = w.api("GET", "/v1/capacity")
        assert status == 200, cap
        total, reserved = cap["total"], cap["reserved"]
        if any(reserved[k] > total[k] for k in total if isinstance(total[k], int | float)):
            overcommitted.append(w.host)
    return Report(
        minutes=round(minutes, 1),
        rounds=done,
        acked=len(told),
        destroyed=len(ledger.destroyed),
        unanswered=ledger.unanswered,
        statuses=dict(sorted(ledger.statuses.items())),
        lost=sorted(live - set(holders)),
        duplicated=sorted(
            {m for m, hs in holders.items() if len(hs) > 1}
            | {m for m, n in processes.items() if n > 1}
        ),
        orphaned=sorted((set(holders) - told) | (set(processes) - set(holders))),
        overcommitted=overcommitted,
    )


def _machine_processes(fleet: Fleet, worker: WorkerNode) -> list[str]:
    """Ids of the machines whose processes run in the worker's namespace, from their
    environment (a process that outlived its machine's record counts too)."""
    found = []
    for pid in fleet.bed.pids(worker.host):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        for var in env:
            if var.startswith(MACHINE_ENV):
                found.append(var[len(MACHINE_ENV) :].decode())
    return found


def write_report(report: Report, path: Path) -> None:
    path.write_text(json.dumps(report.as_json(), indent=2) + "\n")
    os.chmod(path, 0o644)
