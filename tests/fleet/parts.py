"""A souk fleet on a `NetBed`: three clustered nats-servers, workers and brokers, each the real
program in a namespace of its own, reached only over the bridge from the observer."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.fleet.netbed import NetBed

SOUK = Path(sys.executable).parent / "souk"
NATS = shutil.which("nats-server")
NATS_PORT, ROUTE_PORT, MONITOR_PORT = 4222, 6222, 8222
WORKER_PORT, BROKER_PORT = 7100, 4280
SLEEPER = {"init": {"exec": ["sleep", "600"]}, "restart": {"policy": "no"}}


def eventually(check: Callable[[], Any], timeout: float = 15.0, what: str = "") -> Any:
    """`check()`'s first truthy result, polled until `timeout`; an OSError counts as not yet."""
    deadline = time.monotonic() + timeout
    last: Any = None
    while True:
        try:
            last = check()
        except OSError as exc:
            last = exc
        else:
            if last:
                return last
        if time.monotonic() > deadline:
            raise AssertionError(f"not reached in {timeout}s: {what} (last: {last!r})")
        time.sleep(0.1)


def http(
    method: str,
    url: str,
    body: Any = None,
    token: str | None = None,
    timeout: float = 10.0,
    headers: dict[str, str] | None = None,
) -> tuple[int, Any]:
    """One request; any HTTP status comes back, only transport errors raise (OSError)."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    req.add_header("Content-Type", "application/json")
    if token:
        req.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(req, timeout=timeout) as resp:
            status, raw = resp.status, resp.read()
    except urllib.error.HTTPError as exc:
        status, raw = exc.code, exc.read()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, raw.decode(errors="replace")


@dataclass
class Part:
    """One process in its host's namespace."""

    bed: NetBed
    host: str
    logs: Path
    proc: subprocess.Popen[bytes] | None = field(default=None, repr=False)

    @property
    def address(self) -> str:
        return self.bed.hosts[self.host].address

    @property
    def log_path(self) -> Path:
        return self.logs / f"{self.host}.log"

    def argv(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    @property
    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def start(self, timeout: float = 30.0) -> None:
        assert not self.alive, f"{self.host} is already running"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.bed.argv_in(self.host, self.argv()),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,  # a terminal's Ctrl-C is for the fleet's owner
            )
        eventually(self._ready, timeout, f"{self.host} ready ({self.log_path})")

    def _ready(self) -> bool:
        if not self.alive:
            raise RuntimeError(f"{self.host} exited: {self.log_path.read_text()[-2000:]}")
        return self.bed.call(self.ready)

    def kill(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def call(
        self,
        url: str,
        method: str,
        path: str,
        body: Any = None,
        token: str | None = None,
        timeout: float = 10.0,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        """A request from the observer."""
        return self.bed.call(http, method, url + path, body, token, timeout, headers)


@dataclass
class NatsNode(Part):
    """A nats-server routed to every other server of the cluster (explicit routes, retried for
    ever: a restarted server rejoins by itself)."""

    peers: list[str] = field(default_factory=list)

    @property
    def url(self) -> str:
        return f"nats://{self.address}:{NATS_PORT}"

    @property
    def monitor(self) -> str:
        return f"http://{self.address}:{MONITOR_PORT}"

    def config(self) -> str:
        routes = ", ".join(f"nats-route://{p}:{ROUTE_PORT}" for p in self.peers)
        return (
            f"server_name: {self.host}\n"
            f"listen: {self.address}:{NATS_PORT}\n"
            f"http: {self.address}:{MONITOR_PORT}\n"
            "cluster {\n"
            "  name: skf\n"
            f"  listen: {self.address}:{ROUTE_PORT}\n"
            f"  routes: [{routes}]\n"
            "}\n"
        )

    def argv(self) -> list[str]:
        assert NATS is not None, "nats-server is not installed"
        conf = self.logs / f"{self.host}.conf"
        conf.write_text(self.config())
        return [NATS, "-c", str(conf)]

    def ready(self) -> bool:
        return http("GET", self.monitor + "/varz", timeout=1)[0] == 200

    def routes(self) -> int:
        """Routes this server has up right now (0 if it does not answer)."""
        try:
            status, body = self.call(self.monitor, "GET", "/routez", timeout=1)
        except OSError:
            return 0
        return int(body.get("num_routes", 0)) if status == 200 else 0


@dataclass
class WorkerNode(Part):
    region: str = "mad"
    nats: str = ""
    driver: str = "process"

    @property
    def url(self) -> str:
        return f"http://{self.address}:{WORKER_PORT}"

    def argv(self) -> list[str]:
        listen = f"{self.address}:{WORKER_PORT}"
        return [
            str(SOUK),
            "worker",
            "--name",
            self.host,
            "--region",
            self.region,
            "--listen",
            listen,
            "--advertise",
            f"http://{listen}",
            "--insecure",  # a bed of its own namespaces: plain HTTP, like the broker's
            "--data-dir",
            str(self.logs / self.host),
            "--cpus",
            "64",  # offered, not taken: a sleeper uses next to nothing
            "--memory-mb",
            "65536",
            "--driver",
            self.driver,
            "--no-fsync",
            "--nats",
            self.nats,
            "--insecure",  # plain HTTP and an open bus, off loopback: the bed tests links
            "--log-level",
            "warning",
        ]

    def ready(self) -> bool:
        return http("GET", self.url + "/v1/capacity", timeout=1)[0] == 200

    def api(self, method: str, path: str, body: Any = None) -> tuple[int, Any]:
        return self.call(self.url, method, path, body)

    def machines(self, include_deleted: bool = False) -> list[dict[str, Any]]:
        q = "?include_deleted=true" if include_deleted else ""
        status, body = self.api("GET", "/v1/machines" + q)
        assert status == 200, (self.host, status, body)
        return list(body)

    def destroy_all(self) -> None:
        """Every machine destroyed, so that this worker reaps their processes."""
        live = [m["id"] for m in self.machines() if m["state"] != "destroyed"]
        for mid in live:
            self.api("DELETE", f"/v1/machines/{mid}?force=true")
        for mid in live:
            self.api("GET", f"/v1/machines/{mid}/wait?state=destroyed&timeout=5")


@dataclass
class BrokerNode(Part):
    nats: str = ""
    secret: Path = Path()
    token: str = ""
    registry_url: str | None = None  # None: this broker hosts the app registry

    @property
    def url(self) -> str:
        return f"http://{self.address}:{BROKER_PORT}"

    def argv(self) -> list[str]:
        registry = (
            ["--app-registry", str(self.logs / f"{self.host}-registry")]
            if self.registry_url is None
            else ["--app-registry-url", self.registry_url]
        )
        return [
            str(SOUK),
            "broker",
            "--listen",
            f"{self.address}:{BROKER_PORT}",
            "--secret-file",
            str(self.secret),
            "--nats",
            self.nats,
            "--insecure",
            *registry,
            "--log-level",
            "warning",
        ]

    def ready(self) -> bool:
        return http("GET", self.url + "/v1/catalog/workers", token=self.token, timeout=1)[0] == 200

    def api(
        self,
        method: str,
        path: str,
        body: Any = None,
        timeout: float = 10.0,
        headers: dict[str, str] | None = None,
    ) -> tuple[int, Any]:
        return self.call(self.url, method, path, body, self.token, timeout, headers)

    def reachable(self) -> dict[str, bool]:
        """Every worker this broker's catalog replica knows: is it heard from?"""
        status, body = self.api("GET", "/v1/catalog/workers?all=true")
        assert status == 200, (status, body)
        return {w["id"]: not w["unreachable"] for w in body}

    def create(
        self,
        app: str,
        region: str = "mad",
        timeout: float = 15.0,
        query: str = "",
        key: str | None = None,
        **extra: Any,
    ) -> tuple[int, Any]:
        """`POST /v1/apps/{app}/machines[?query]` with a sleeper; `extra` goes into the body,
        `key` into an Idempotency-Key header."""
        body = {"region": region, "config": SLEEPER, **extra}
        path = f"/v1/apps/{app}/machines" + (f"?{query}" if query else "")
        headers = {"Idempotency-Key": key} if key else None
        return self.api("POST", path, body, timeout, headers)

    def listed(self, app: str) -> set[str]:
        """Ids of the app's machines as `GET /v1/apps/{app}/machines` lists them."""
        status, body = self.api("GET", f"/v1/apps/{app}/machines")
        assert status == 200, (status, body)
        return {m["id"] for m in body}

    def catalog_rows(self) -> dict[str, tuple[str, str]]:
        """The replica's machines: id -> (worker, state)."""
        status, body = self.api("GET", "/v1/catalog/machines")
        assert status == 200, (status, body)
        return {m["id"]: (m["worker_id"], m["state"]) for m in body}


@dataclass
class Fleet:
    bed: NetBed
    logs: Path
    nats: list[NatsNode]
    workers: list[WorkerNode]
    brokers: list[BrokerNode]

    @property
    def nats_urls(self) -> str:
        return ",".join(n.url for n in self.nats)

    @property
    def broker(self) -> BrokerNode:
        return self.brokers[0]

    def worker(self, name: str) -> WorkerNode:
        return next(w for w in self.workers if w.host == name)

    def parts(self) -> list[Part]:
        return [*self.nats, *self.workers, *self.brokers]

    def cluster_formed(self) -> bool:
        return all(n.routes() == len(self.nats) - 1 for n in self.nats)

    def start(self) -> None:
        """Servers first (routes up), then workers and brokers, each group in parallel."""
        with ThreadPoolExecutor(len(self.parts())) as pool:
            list(pool.map(lambda n: n.start(), self.nats))
            eventually(self.cluster_formed, 20, "the nats cluster's routes")
            list(pool.map(lambda p: p.start(), [*self.workers, *self.brokers]))
        self.placeable_everywhere()

    def heard_since(self, moment: float, timeout: float = 20.0) -> None:
        """Until every broker has heard every worker after `moment` (time.monotonic() here):
        a heartbeat that crossed the bus after it, so the routes carry both directions."""

        def fresh(broker: BrokerNode) -> bool:
            status, body = broker.api("GET", "/v1/catalog/status")
            assert status == 200, body
            silent = {o["owner"]: o["silent_for"] for o in body["owners"]}
            since = time.monotonic() - moment
            return all(
                silent.get(w.host) is not None and silent[w.host] < since for w in self.workers
            )

        for broker in self.brokers:
            eventually(lambda b=broker: fresh(b), timeout, f"{broker.host} hears every worker")  # type: ignore[misc]

    def placeable_everywhere(self, timeout: float = 30.0) -> None:
        """Until every broker places on every worker (the others avoided): offers and answers
        cross the bus both ways, the broker reaches the worker over HTTP. After a partition,
        each end of a stalled TCP connection resumes sending only when its own retransmission
        timer fires, seconds apart: a heartbeat heard proves one direction only. The machines
        made here (app `canary`) are destroyed again."""

        def placed(broker: BrokerNode, worker: WorkerNode) -> str | None:
            others = [w.host for w in self.workers if w is not worker]
            status, body = broker.create("canary", worker.region, avoid_workers=others)
            return str(body["id"]) if status == 200 else None

        for broker in self.brokers:
            status, body = broker.api("POST", "/v1/apps", {"name": "canary"})
            assert status in (201, 409), body
            for worker in self.workers:
                mid = eventually(
                    lambda b=broker, w=worker: placed(b, w),  # type: ignore[misc]
                    timeout,
                    f"{broker.host} places on {worker.host}",
                )
                status, body = broker.api("DELETE", f"/v1/apps/canary/machines/{mid}?force=true")
                assert status == 200, body

    def connections(self) -> dict[str, str]:
        """Which server each host's bus connection is on right now: host -> server host, from
        the live servers' `/connz` (a client is known by its address)."""
        hosts = {h.address: h.name for h in self.bed.hosts.values()}
        found = {}
        for server in self.nats:
            if not server.alive:
                continue
            status, body = server.call(server.monitor, "GET", "/connz", timeout=2)
            if status == 200:
                for conn in body.get("connections") or []:
                    if conn.get("ip") in hosts:
                        found[hosts[conn["ip"]]] = server.host
        return found

    def all_connected(self) -> bool:
        """Every worker and broker has a bus connection to a live server."""
        return {p.host for p in [*self.workers, *self.brokers]} <= set(self.connections())

    def arrange(self, targets: dict[str, NatsNode]) -> None:
        """Each host named moves its bus connection to its target server: everyone is herded
        onto a third server, which is then killed while each host can reach only its target,
        then restarted."""
        spare = next(n for n in self.nats if n not in targets.values())
        self.herd(spare)
        cuts = [
            self.bed.drop(host, [n.host for n in self.nats if n not in (target, spare)])
            for host, target in targets.items()
        ]
        spare.kill()
        want = {host: target.host for host, target in targets.items()}
        eventually(
            lambda: all(self.connections().get(h) == t for h, t in want.items()),
            20,
            f"connections moved to {want}",
        )
        for cut in cuts:
            cut.restore()
        spare.start()
        eventually(self.cluster_formed, 20, "the nats cluster's routes")

    def herd(self, onto: NatsNode) -> None:
        """Every part's bus connection moved onto `onto`: the other servers are killed until
        everyone has reconnected to it, then restarted."""
        others = [n for n in self.nats if n is not onto]
        for server in others:
            server.kill()
        eventually(
            lambda: self.all_connected() and set(self.connections().values()) == {onto.host},
            20,
            f"every part on {onto.host}",
        )
        for server in others:
            server.start()
        eventually(self.cluster_formed, 20, "the nats cluster's routes")

    def converged(self, broker: BrokerNode | None = None) -> bool:
        """The broker's replica holds every machine as its worker does (destroyed ones too)."""
        truth = {}
        for w in self.workers:
            for m in w.machines(include_deleted=True):
                truth[m["id"]] = (w.host, m["state"])
        return (broker or self.broker).catalog_rows() == truth

    def close(self) -> None:
        """Machines destroyed where their worker answers, then every process and namespace
        removed (the bed's own teardown sweeps whatever a namespace still runs)."""
        try:
            self.bed.heal()
            with ThreadPoolExecutor(max(1, len(self.workers))) as pool:
                list(pool.map(_destroy_quietly, [w for w in self.workers if w.alive]))
        finally:
            for part in self.parts():
                part.kill()
            self.bed.down()


def _destroy_quietly(worker: WorkerNode) -> None:
    try:
        worker.destroy_all()
    except (OSError, AssertionError):
        pass  # the namespace sweep kills what is left


def build(
    bed: NetBed,
    logs: Path,
    secret: Path,
    token: str,
    workers: list[str],
    brokers: int = 1,
    driver: str = "process",
) -> Fleet:
    """Hosts for 3 nats-servers (.11-.13), workers (`region` per worker, .21 on) and brokers
    (.41 on) on the bed; nothing started yet. The first broker hosts the app registry."""
    names = [f"nats{i}" for i in (1, 2, 3)]
    for i, name in enumerate(names):
        bed.add_host(name, 11 + i)
    addresses = [bed.hosts[n].address for n in names]
    nats = [
        NatsNode(bed, n, logs, peers=[a for a in addresses if a != bed.hosts[n].address])
        for n in names
    ]
    urls = ",".join(n.url for n in nats)
    nodes = []
    for i, region in enumerate(workers):
        bed.add_host(f"w{i + 1}", 21 + i)
        (logs / f"w{i + 1}").mkdir(parents=True, exist_ok=True)
        nodes.append(WorkerNode(bed, f"w{i + 1}", logs, region=region, nats=urls, driver=driver))
    first: str | None = None
    made = []
    for i in range(brokers):
        bed.add_host(f"b{i + 1}", 41 + i)
        b = BrokerNode(bed, f"b{i + 1}", logs, nats=urls, secret=secret, token=token)
        b.registry_url = first
        first = first or b.url
        made.append(b)
    return Fleet(bed, logs, nats, nodes, made)
