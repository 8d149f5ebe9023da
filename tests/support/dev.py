"""`souk dev` in a subprocess (three regions of two process-driver workers each, a broker and a
proxy), reached over HTTP and through the `souk` program."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from typer.testing import CliRunner, Result

from souk.cli.main import app as souk_app
from tests.support.ports import free_port

WORKERS = 6  # what `souk dev` starts
READY_TIMEOUT = 30.0


@dataclass
class Dev:
    url: str
    token: str
    proxy: str = ""

    def env(self) -> dict[str, str]:
        return {"SOUK_API": self.url, "SOUK_TOKEN": self.token}

    def call(self, method: str, path: str, body: Any = None) -> Any:
        req = urllib.request.Request(
            self.url + path,
            data=json.dumps(body).encode() if body is not None else None,
            method=method,
            headers={"Authorization": f"Bearer {self.token}", "Content-Type": "application/json"},
        )
        with urllib.request.urlopen(req, timeout=30) as resp:
            payload = resp.read()
        return json.loads(payload) if payload else None

    def souk(self, *args: str) -> Result:
        """The `souk` program in this process, pointed at the cluster."""
        return CliRunner().invoke(souk_app, list(args), env=self.env())

    def machines(self, app: str) -> list[dict[str, Any]]:
        return list(self.call("GET", f"/v1/apps/{app}/machines"))

    def destroy_app(self, app: str) -> None:
        """Destroy the app's machines and wait until they are gone (their processes with them:
        a machine's process outlives its worker by design)."""
        try:
            for m in self.machines(app):
                self.call("DELETE", f"/v1/apps/{app}/machines/{m['id']}?force=true")
            deadline = time.monotonic() + 20
            while self.machines(app) and time.monotonic() < deadline:
                time.sleep(0.1)
        except urllib.error.HTTPError as exc:
            if exc.code != 404:
                raise


@contextlib.contextmanager
def souk_dev(data: Path) -> Iterator[Dev]:
    """`souk dev` on free loopback ports, once all its workers are listed; on the way out every
    app's machines are destroyed and the whole process group is stopped."""
    port, proxy = free_port(), free_port()
    argv = ["souk", "dev", "--data-dir", str(data), "--listen", f"127.0.0.1:{port}"]
    argv += ["--image-registry-port", "0"]  # any free port: tests run side by side
    argv += ["--proxy", f"127.0.0.1:{proxy}"]
    with (data / "dev.log").open("wb") as log:
        proc = subprocess.Popen(
            [sys.executable, "-m", *argv],
            stdout=log,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        cluster = Dev(f"http://127.0.0.1:{port}", "", f"http://127.0.0.1:{proxy}")
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            if proc.poll() is not None:
                raise RuntimeError(f"souk dev exited: {(data / 'dev.log').read_text()[-2000:]}")
            token = data / "token"
            if token.exists() and token.read_text().strip():
                cluster.token = token.read_text().strip()
                try:
                    if len(cluster.call("GET", "/v1/workers")) == WORKERS:
                        break
                except (OSError, urllib.error.URLError):
                    pass
            if time.monotonic() > deadline:
                proc.kill()
                raise RuntimeError("souk dev did not come up")
            time.sleep(0.1)
        try:
            yield cluster
        finally:
            for a in cluster.call("GET", "/v1/apps")["apps"]:
                cluster.destroy_app(a["name"])
            os.killpg(proc.pid, signal.SIGTERM)
            try:
                proc.wait(10)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
                proc.wait()
