"""What a user reads: a part that cannot start says why in one line (exit 2), a bad flag is
one line, tables keep whole ids when piped and never show `None`, help names values, not
Python types, and image machines show what they run."""

from __future__ import annotations

import json
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cli.conftest import souk
from tests.support.dev import Dev
from tests.support.waiting import wait_until

pytestmark = pytest.mark.integration


@pytest.fixture
def taken() -> Iterator[int]:
    """A loopback port something else listens on."""
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        yield held.getsockname()[1]


def test_a_port_in_use_is_one_line_and_exit_2(taken: int, tmp_path: Path) -> None:
    assert souk("tokens", "secret", "--out", "secret", cwd=tmp_path).returncode == 0
    at = f"127.0.0.1:{taken}"
    worker = ["worker", "--name", "w1", "--region", "mad", "--cpus", "1", "--memory-mb", "64"]
    broker = ["broker", "--secret-file", "secret", "--worker", "http://127.0.0.1:9"]
    parts = {
        "worker": [*worker, "--data-dir", "w1", "--driver", "sim", "--listen", at],
        "broker": [*broker, "--listen", at],
        "dev": [
            "dev",
            "--data-dir",
            "dev",
            "--driver",
            "sim",
            "--image-registry-port=0",
            "--listen",
            at,
        ],
    }
    for part, argv in parts.items():
        done = souk(*argv, cwd=tmp_path)
        assert done.returncode == 2, (part, done.stderr)
        (line,) = done.stderr.strip().splitlines()  # one line, no traceback
        assert line.startswith(f"souk {part}: cannot listen") and "address already in use" in line


def test_a_bad_flag_is_one_line_naming_the_help(tmp_path: Path) -> None:
    done = souk("machines", "list", "--bogus", cwd=tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip() == (
        "souk machines list: No such option: --bogus (see souk machines list --help)"
    )


def test_help_names_values_not_types() -> None:
    for command in (["worker"], ["machines", "list"], ["tokens", "create"], ["dev"]):
        text = souk(*command, "--help", cwd=Path.cwd(), columns=200).stdout
        assert "<bool>" not in text and "<list[str]>" not in text and "<str>" not in text
    worker = souk("worker", "--help", cwd=Path.cwd(), columns=200).stdout
    assert "--no-fsync" in worker and "--no-no-fsync" not in worker
    top = souk("--help", cwd=Path.cwd(), columns=200).stdout
    assert "Create, list and destroy apps" in top


def test_piped_tables_keep_whole_ids_and_commands(dev: Dev, project: Path) -> None:
    assert souk("apps", "create", "wide", cwd=project).returncode == 0
    long_arg = "x" * 120
    run = souk(
        "machines",
        "run",
        "-a",
        "wide",
        "-r",
        "ams",
        "--json",
        "--",
        "sh",
        "-c",
        f"exec sleep 600 # {long_arg}",
        cwd=project,
    )
    assert run.returncode == 0, run.stderr
    mid = json.loads(run.stdout)["id"]
    listed = souk("machines", "list", "-a", "wide", cwd=project, columns=60)
    assert mid in listed.stdout and long_arg in listed.stdout, listed.stdout
    assert "None" not in listed.stdout and "…" not in listed.stdout
    done = souk("machines", "destroy", "-a", "wide", "--force", mid, cwd=project)
    assert done.returncode == 0, done.stderr
    assert "destroyed" in done.stdout and "started" not in done.stdout


def test_an_image_machine_shows_its_image_as_its_command(dev: Dev, project: Path) -> None:
    dev.call("POST", "/v1/apps", {"name": "imaged"})
    image = "127.0.0.1:9/nothing/here:1"
    body = {"region": "mad", "skip_launch": True, "config": {"image": image}}
    try:
        mid = dev.call("POST", "/v1/apps/imaged/machines", body)["id"]
    except OSError as exc:  # a worker that runs no images (not root, no runc)
        pytest.skip(f"no worker runs images here: {exc}")
    shown = souk("machines", "status", "-a", "imaged", mid, cwd=project)
    assert shown.returncode == 0, shown.stderr
    assert image in shown.stdout, shown.stdout


def test_an_expected_failure_is_logged_in_one_line(dev: Dev, project: Path) -> None:
    """A machine whose image cannot be pulled fails with the reason, logged once, without a
    traceback (one is for what nobody foresaw)."""
    dev.call("POST", "/v1/apps", {"name": "unpulled"})
    body = {"region": "mad", "config": {"image": "127.0.0.1:9/nothing/here:1"}}
    try:
        mid = dev.call("POST", "/v1/apps/unpulled/machines", body)["id"]
    except OSError as exc:
        pytest.skip(f"no worker runs images here: {exc}")
    log = project / ".souk-dev" / "dev.log"
    wait_until(lambda: f"on {mid} failed" in log.read_text(), timeout=30)
    lines = log.read_text().splitlines()
    failed = [i for i, line in enumerate(lines) if f"on {mid} failed" in line]
    assert failed, lines[-20:]
    after = lines[failed[0] + 1 : failed[0] + 2]
    assert not any(line.startswith("Traceback") for line in after), lines[failed[0] :][:10]


def test_the_bus_configuration_says_where_it_listens(tmp_path: Path) -> None:
    bus = ["--role", "bus", "--name", "nats-1", "--san", "127.0.0.1", "--out", "tls-nats"]
    steps = [["ca", "init", "--dir", "ca"], ["certs", "issue", "--ca-dir", "ca", *bus]]
    for step in steps:
        assert souk(*step, cwd=tmp_path).returncode == 0
    config = [
        "nats",
        "config",
        "--tls-dir",
        "tls-nats",
        "--out",
        "nats.conf",
        "--node",
        "worker:w1@mad",
    ]
    wide = souk(*config, cwd=tmp_path)
    assert wide.returncode == 0, wide.stderr
    assert "0.0.0.0:4222 (every address of this host" in wide.stdout, wide.stdout
    narrow = souk(*config, "--host", "127.0.0.1", cwd=tmp_path)
    assert "clients connect on 127.0.0.1:4222" in narrow.stdout
    assert "every address" not in narrow.stdout
