"""`souk dev` stopped with Ctrl-C (or SIGTERM) leaves no machine's process behind: machines
outlive their worker on purpose, so the dev cluster destroys them itself before it exits."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

import pytest

from tests.support.machines import kill_machine_processes, live_pids
from tests.support.ports import free_port
from tests.support.waiting import wait_until

WORKERS = 6


class DevProcess:
    """`souk dev` as a process of its own, reached over HTTP; nothing cleaned for it here."""

    def __init__(self, data: Path, *extra: str) -> None:
        self.data = data
        self.url = f"http://127.0.0.1:{free_port()}"
        argv = [
            "souk",
            "dev",
            "--data-dir",
            str(data),
            "--listen",
            self.url.removeprefix("http://"),
        ]
        argv += ["--proxy", f"127.0.0.1:{free_port()}", "--image-registry-port", "0", *extra]
        self.log = data.parent / "dev.log"
        self.begins = self.log.stat().st_size if self.log.exists() else 0  # this run's output
        with self.log.open("ab") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", *argv],
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self.token = ""

    def call(self, method: str, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(
            self.url + path,
            data=None if body is None else json.dumps(body).encode(),
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            payload = resp.read()
        return json.loads(payload) if payload else None

    def ready(self) -> bool:
        if self.proc.poll() is not None:
            raise RuntimeError(f"souk dev exited: {self.log.read_text()[-2000:]}")
        token = self.data / "token"
        if not token.exists() or not token.read_text().strip():
            return False
        if "then, in examples" not in self.log.read_text()[self.begins :]:
            return False  # its banner printed: its own Ctrl-C handling is in place
        self.token = token.read_text().strip()
        try:
            return len(self.call("GET", "/v1/workers")) == WORKERS
        except (OSError, urllib.error.URLError):
            return False

    def kill(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait()


def up(data: Path, *args: str, tries: int = 5) -> DevProcess:
    """`souk dev` ready; started again on other ports when one of those it was given was
    taken meanwhile (a busy host's loopback connections use them too)."""
    for _ in range(tries - 1):
        dev = DevProcess(data, *args)
        try:
            wait_until(dev.ready, 60, "souk dev up")
            return dev
        except RuntimeError:
            if "address already in use" not in dev.log.read_text()[dev.begins :]:
                raise
    dev = DevProcess(data, *args)
    wait_until(dev.ready, 60, "souk dev up")
    return dev


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["SIGINT", "SIGTERM"])
def test_stopping_souk_dev_destroys_every_machine(tmp_path: Path, sig: signal.Signals) -> None:
    dev = up(tmp_path / "dev")
    made: set[str] = set()
    try:
        dev.call("POST", "/v1/apps", {"name": "keep"})
        for region in ("mad", "ams"):  # machines on two workers
            body = {"region": region, "config": {"init": {"exec": ["sleep", "600"]}}}
            made.add(dev.call("POST", "/v1/apps/keep/machines", body)["id"])
        for mid in made:
            wait_until(lambda m=mid: bool(live_pids(m)), 15, f"machine {mid} runs")

        os.kill(dev.proc.pid, sig)
        assert dev.proc.wait(60) == 0, dev.log.read_text()[-2000:]

        assert {mid: live_pids(mid) for mid in made} == {mid: [] for mid in made}
        assert f"destroying {len(made)} machines" in dev.log.read_text()
    finally:
        dev.kill()
        kill_machine_processes(made)
