"""A real `souk worker` process on loopback, driven only over HTTP."""

from __future__ import annotations

import contextlib
import json
import ssl
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.support.machines import kill_machine_processes, recorded_ids
from tests.support.ports import free_port

SOUK = Path(sys.executable).parent / "souk"
READY_TIMEOUT = 20.0


@dataclass
class Reply:
    status: int
    body: Any


@dataclass
class WorkerProcess:
    """One `souk worker` process; `start()` again after `kill9()` resumes on the same data dir."""

    data_dir: Path
    log_path: Path
    cpus: int = 8
    memory_mb: int = 8192
    driver: str = "process"
    name: str = "w1"
    port: int = field(default_factory=free_port)
    proc: subprocess.Popen[bytes] | None = None
    seen: set[str] = field(default_factory=set)  # machine ids this worker answered with
    tls: ssl.SSLContext | None = None  # a client's context with its certificate: a TLS worker

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    @property
    def db_path(self) -> Path:
        return self.data_dir / "worker.db"

    def argv(self) -> list[str]:
        return [
            str(SOUK),
            "worker",
            "--name",
            self.name,
            "--region",
            "mad",
            "--listen",
            f"127.0.0.1:{self.port}",
            "--data-dir",
            str(self.data_dir),
            "--cpus",
            str(self.cpus),
            "--memory-mb",
            str(self.memory_mb),
            "--driver",
            self.driver,
            "--log-level",
            "warning",
        ]

    def start(self) -> None:
        assert self.proc is None or self.proc.poll() is not None, "already running"
        with open(self.log_path, "ab") as log:
            self.proc = subprocess.Popen(
                self.argv(), stdin=subprocess.DEVNULL, stdout=log, stderr=log
            )
        deadline = time.monotonic() + READY_TIMEOUT
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"worker exited: {self.log_path.read_text()[-2000:]}")
            try:
                if self.call("GET", "/v1/capacity", timeout=1).status == 200:
                    return
            except OSError:
                pass
            time.sleep(0.02)
        raise RuntimeError(f"worker not ready in {READY_TIMEOUT}s: {self.log_path.read_text()}")

    def kill9(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def call(
        self,
        method: str,
        path: str,
        body: Any = None,
        *,
        data: bytes | None = None,
        headers: dict[str, str] | None = None,
        timeout: float = 15.0,
    ) -> Reply:
        """One request; any HTTP status comes back as a Reply (only transport errors raise)."""
        hdrs = dict(headers or {})
        if body is not None:
            data = json.dumps(body).encode()
            hdrs.setdefault("Content-Type", "application/json")
        req = urllib.request.Request(self.url + path, data=data, method=method, headers=hdrs)
        try:
            with urllib.request.urlopen(req, timeout=timeout, context=self.tls) as resp:
                status, raw = resp.status, resp.read()
        except urllib.error.HTTPError as exc:
            status, raw = exc.code, exc.read()
        try:
            parsed: Any = json.loads(raw) if raw else None
        except ValueError:
            parsed = raw.decode(errors="replace")
        self._note(parsed)
        return Reply(status, parsed)

    def _note(self, parsed: Any) -> None:
        items = parsed if isinstance(parsed, list) else [parsed]
        for item in items:
            if isinstance(item, dict) and isinstance(item.get("id"), str) and "config" in item:
                self.seen.add(item["id"])

    def ok(self, method: str, path: str, body: Any = None, status: int = 200) -> Any:
        reply = self.call(method, path, body)
        assert reply.status == status, (method, path, reply)
        return reply.body

    def create(self, config: dict[str, Any], **extra: Any) -> dict[str, Any]:
        machine: dict[str, Any] = self.ok(
            "POST", "/v1/machines", {"app": "demo", "config": config, **extra}, 201
        )
        return machine

    def wait(self, machine_id: str, state: str, timeout: float = 15.0) -> dict[str, Any]:
        """Until the machine settles in `state`; fails the test with its state otherwise."""
        reply = self.call(
            "GET",
            f"/v1/machines/{machine_id}/wait?state={state}&timeout={timeout}",
            timeout=timeout + 5,
        )
        assert reply.status == 200, f"{machine_id} not {state}: {reply.body}"
        return self.machine(machine_id)

    def machine(self, machine_id: str) -> dict[str, Any]:
        found: dict[str, Any] = self.ok("GET", f"/v1/machines/{machine_id}")
        return found

    def known_ids(self) -> set[str]:
        """Every machine id this worker answered with or recorded, for the teardown sweep."""
        return self.seen | recorded_ids(self.db_path)

    def close(self) -> None:
        """Kill the worker, then every process left running for its machines.

        Running machines are destroyed over the API first, so that the worker reaps the
        processes it spawned (nothing else on the host may: orphans would linger as zombies)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                running = [
                    m["id"]
                    for m in self.call("GET", "/v1/machines", timeout=5).body
                    if m["state"] in ("starting", "started", "stopping", "suspended")
                ]
                for mid in running:
                    self.call("DELETE", f"/v1/machines/{mid}?force=true", timeout=5)
                for mid in running:
                    self.call("GET", f"/v1/machines/{mid}/wait?state=destroyed&timeout=5")
            except (OSError, TypeError, KeyError):
                pass  # best effort: the sweep below gets whatever is left
        self.kill9()
        ids = self.known_ids()
        for _ in range(2):  # twice: a spawn may have been between fork and exec
            kill_machine_processes(ids)
            time.sleep(0.05)


@dataclass
class CatalogWorker(WorkerProcess):
    """A worker publishing its rows to the catalog over NATS."""

    region: str = "mad"
    nats: str = ""

    def argv(self) -> list[str]:
        argv = super().argv()
        argv[argv.index("--region") + 1] = self.region
        return [*argv, "--nats", self.nats]


WorkerFactory = Callable[..., WorkerProcess]


@contextlib.contextmanager
def worker_processes(tmp_path: Path) -> Iterator[WorkerFactory]:
    """Starts real workers (`spawn(cpus=..., memory_mb=..., driver=...)`); every one of them,
    and every machine process they left, is killed on the way out."""
    workers: list[WorkerProcess] = []

    def spawn(**options: Any) -> WorkerProcess:
        n = len(workers) + 1
        worker = WorkerProcess(tmp_path / f"w{n}", tmp_path / f"w{n}.log", **options)
        workers.append(worker)
        worker.start()
        return worker

    try:
        yield spawn
    finally:
        for worker in workers:
            worker.close()
