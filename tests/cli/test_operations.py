"""`souk systemd` units and `souk backup`'s refusals."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.worker_process import SOUK


def souk(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SOUK), *args], capture_output=True, text=True, timeout=60)


def unit(part: str) -> dict[str, list[str]]:
    done = souk("systemd", part)
    assert done.returncode == 0, done.stderr
    settings: dict[str, list[str]] = {}
    for line in done.stdout.splitlines():
        if "=" in line:
            key, value = line.split("=", 1)
            settings.setdefault(key, []).append(value)
    return settings


def test_the_workers_unit_keeps_its_machines_across_a_restart() -> None:
    worker = unit("worker")
    assert worker["KillMode"] == ["process"]
    assert worker["ExecStart"][0].endswith("worker --config /etc/souk/worker.toml")
    assert worker["ExecStart"][0].startswith("/")
    assert worker["Restart"] == ["on-failure"]
    assert "NoNewPrivileges" not in worker  # it starts runc and machines as their users


@pytest.mark.parametrize("part", ["broker", "proxy", "nats"])
def test_the_other_units_are_sandboxed(part: str) -> None:
    settings = unit(part)
    assert settings["NoNewPrivileges"] == ["yes"]
    assert settings["ProtectSystem"] == ["strict"]
    assert settings["DynamicUser"] == ["yes"]
    assert "KillMode" not in settings


def test_a_backup_refuses_a_missing_database_and_an_existing_copy(tmp_path: Path) -> None:
    missing = souk("backup", "worker", "--data-dir", str(tmp_path), str(tmp_path / "b.db"))
    assert missing.returncode == 2 and "no database" in missing.stderr
    (tmp_path / "worker.db").write_bytes(b"")
    (tmp_path / "b.db").write_bytes(b"keep")
    exists = souk("backup", "worker", "--data-dir", str(tmp_path), str(tmp_path / "b.db"))
    assert exists.returncode == 2 and "exists" in exists.stderr
    assert (tmp_path / "b.db").read_bytes() == b"keep"
