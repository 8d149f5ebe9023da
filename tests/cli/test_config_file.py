"""`--config FILE` and `--print-config` of the long-running parts, through the `souk` program."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.support.worker_process import SOUK

WORKER_FLAGS = [
    "--name", "w1", "--region", "mad", "--data-dir", "data", "--cpus", "4",
    "--memory-mb", "2048", "--cpu-kind", "shared", "--cpu-kind", "performance",
    "--label", "rack=r1", "--no-fsync",
]  # fmt: skip
WORKER_FILE = """name = "w1"
region = "mad"
data-dir = "data"
cpus = 4
memory-mb = 2048
cpu-kind = ["shared", "performance"]
label = ["rack=r1"]
no-fsync = true
"""


def souk(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run([str(SOUK), *args], capture_output=True, text=True, cwd=cwd, timeout=60)


def test_a_config_file_equals_its_flags(tmp_path: Path) -> None:
    (tmp_path / "worker.toml").write_text(WORKER_FILE)
    from_flags = souk("worker", *WORKER_FLAGS, "--print-config", cwd=tmp_path)
    from_file = souk("worker", "--config", "worker.toml", "--print-config", cwd=tmp_path)
    assert from_flags.returncode == 0, from_flags.stderr
    assert from_file.returncode == 0, from_file.stderr
    assert from_file.stdout == from_flags.stdout
    assert f'data-dir = "{tmp_path / "data"}"' in from_file.stdout


def test_flags_win_over_the_file_and_paths_are_the_files_own(tmp_path: Path) -> None:
    etc = tmp_path / "etc"
    etc.mkdir()
    (etc / "worker.toml").write_text(WORKER_FILE)
    shown = souk("worker", "--config", "etc/worker.toml", "--cpus", "8", "--print-config",
                 cwd=tmp_path)  # fmt: skip
    assert shown.returncode == 0, shown.stderr
    assert "cpus = 8\n" in shown.stdout
    assert f'data-dir = "{etc / "data"}"' in shown.stdout  # relative to the file


@pytest.mark.parametrize("part", ["worker", "broker", "proxy"])
def test_an_unknown_key_is_refused_by_name(tmp_path: Path, part: str) -> None:
    (tmp_path / "part.toml").write_text('listen = "127.0.0.1:1"\nlisten-adress = "x"\n')
    done = souk(part, "--config", "part.toml", "--print-config", cwd=tmp_path)
    assert done.returncode == 2
    assert "unknown key 'listen-adress'" in done.stderr


def test_a_print_config_reads_back_as_the_same_config(tmp_path: Path) -> None:
    (tmp_path / "worker.toml").write_text(WORKER_FILE)
    first = souk("worker", "--config", "worker.toml", "--print-config", cwd=tmp_path).stdout
    (tmp_path / "effective.toml").write_text(first)
    again = souk("worker", "--config", "effective.toml", "--print-config", cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert again.stdout == first
