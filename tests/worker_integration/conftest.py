"""A real `souk worker` process on loopback, driven only over HTTP.

Machines' processes deliberately outlive their worker (a crashed worker adopts them when it comes
back), so tearing a worker down is not enough: every process whose environment names one of its
machines (`SOUK_MACHINE_ID`) is killed too.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import sqlite3
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest

SOUK = Path(sys.executable).parent / "souk"
READY_TIMEOUT = 20.0


@dataclass
class Reply:
    status: int
    body: Any


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


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

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

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
            with urllib.request.urlopen(req, timeout=timeout) as resp:
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
        ids = set(self.seen)
        if self.db_path.exists():
            try:
                with sqlite3.connect(f"file:{self.db_path}?mode=ro", uri=True) as conn:
                    ids.update(row[0] for row in conn.execute("SELECT id FROM machines"))
            except sqlite3.Error:
                pass
        return ids

    def close(self) -> None:
        """Kill the worker, then every process left running for its machines.

        Running machines are destroyed over the API first, so that the worker reaps the
        processes it spawned (nothing else on the host may: orphans would linger as zombies)."""
        if self.proc is not None and self.proc.poll() is None:
            try:
                running = [
                    m["id"]
                    for m in self.call("GET", "/v1/machines", timeout=5).body
                    if m["state"] in ("starting", "started", "stopping")
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
            for pid in machine_processes(ids):
                try:
                    os.killpg(pid, signal.SIGKILL)
                except OSError:
                    pass
                try:
                    os.kill(pid, signal.SIGKILL)
                except OSError:
                    pass
            time.sleep(0.05)


def is_running(pid: int) -> bool:
    """Alive, not a zombie (nothing reaps orphans here, so exited ones may linger as Z)."""
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return stat[stat.rindex(")") + 2] not in "ZX"


def machine_processes(ids: set[str]) -> list[int]:
    """Live pids whose environment names one of these machines."""
    wanted = {f"SOUK_MACHINE_ID={i}".encode() for i in ids}
    found: list[int] = []
    if not wanted:
        return found
    for entry in os.scandir("/proc"):
        if not entry.name.isdigit():
            continue
        try:
            environ = Path(entry.path, "environ").read_bytes()
        except OSError:
            continue
        if wanted.intersection(environ.split(b"\0")) and is_running(int(entry.name)):
            found.append(int(entry.name))
    return found


def live_pids(machine_id: str) -> list[int]:
    return machine_processes({machine_id})


def api_pid(machine: dict[str, Any]) -> int | None:
    """The pid the worker reports for the machine's current process: its newest spawn or
    adoption event (events come newest first)."""
    for event in machine["events"]:
        if event["type"].endswith(".spawn") or event["type"] == "event.adopted":
            pid = event["request"].get("pid")
            return int(pid) if pid is not None else None
    return None


def integrity(db_path: Path) -> str:
    with sqlite3.connect(f"file:{db_path}?mode=ro", uri=True) as conn:
        return str(conn.execute("PRAGMA integrity_check").fetchone()[0])


WorkerFactory = Callable[..., WorkerProcess]


@pytest.fixture
def spawn_worker(tmp_path: Path) -> Iterator[WorkerFactory]:
    """Starts real workers (`spawn_worker(cpus=..., memory_mb=..., driver=...)`); every one
    of them, and every machine process they left, is killed at teardown."""
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


@pytest.fixture
def worker(spawn_worker: WorkerFactory) -> WorkerProcess:
    return spawn_worker()
