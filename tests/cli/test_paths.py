"""Paths as a user types them: relative to where the command runs, made absolute once by the
CLI, and a data dir the machines' users cannot reach refused at start, not machine by machine."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.waiting import wait_until
from tests.support.worker_process import SOUK, WorkerProcess

pytestmark = pytest.mark.integration


@pytest.fixture
def worker_in(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[WorkerProcess]:
    """A `souk worker --data-dir w1` started in `tmp_path`, as the README's cluster runs it."""
    monkeypatch.chdir(tmp_path)
    worker = WorkerProcess(Path("w1"), tmp_path / "worker.log")
    try:
        worker.start()
        yield worker
    finally:
        worker.close()


def test_a_relative_data_dir_is_the_one_below_where_the_worker_started(
    worker_in: WorkerProcess, tmp_path: Path
) -> None:
    """A machine's home (its HOME and working directory, an image's runc state) is an
    absolute path below the data dir: a relative one would be read from the machine's own
    directory, where a destroy then finds nothing."""
    w = worker_in
    script = 'echo "$HOME"; pwd; exec sleep 60'
    m = w.create({"init": {"exec": ["sh", "-c", script]}})
    w.wait(m["id"], "started")
    out = tmp_path / "w1" / "machines" / m["id"] / "stdout.log"
    wait_until(lambda: out.is_file() and len(out.read_text().splitlines()) >= 2, timeout=10)
    home, cwd = out.read_text().splitlines()[:2]
    assert Path(home).is_absolute() and home == cwd, (home, cwd)
    assert Path(home).is_relative_to(tmp_path / "w1")
    w.ok("DELETE", f"/v1/machines/{m['id']}?force=true")
    assert w.wait(m["id"], "destroyed")["state"] == "destroyed"


@pytest.mark.skipif(os.geteuid() != 0, reason="machines run as apps' users only on a root worker")
def test_a_data_dir_the_apps_users_cannot_reach_stops_the_worker_in_one_line(
    tmp_path: Path,
) -> None:
    closed = tmp_path / "private"
    closed.mkdir(mode=0o700)
    argv = [str(SOUK), "worker", "--name", "w1", "--region", "mad", "--cpus", "1"]
    argv += ["--memory-mb", "64", "--listen", "127.0.0.1:1", "--data-dir", "private/w1"]
    done = subprocess.run(argv, cwd=tmp_path, capture_output=True, text=True, timeout=20)
    assert done.returncode == 2, done
    (line,) = done.stderr.splitlines()
    assert str(closed) in line and f"chmod o+x {closed}" in line, line
    assert not (closed / "w1").exists()  # nothing made: it did not start
