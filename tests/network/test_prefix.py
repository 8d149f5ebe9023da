"""The cluster's private prefix: a ULA /48, refused in one line otherwise."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from souk.cli.main import app
from souk.models.wire import DEFAULT_PRIVATE_PREFIX, private_prefix_error


@pytest.mark.parametrize("prefix", ["10.0.0.0/8", "fd00::/64", "2001:db8::/48", "nonsense"])
def test_a_worker_refuses_a_prefix_that_is_no_ula_48(tmp_path: Path, prefix: str) -> None:
    argv = ["worker", "--name", "w", "--region", "r", "--cpus", "1", "--memory-mb", "64"]
    argv += ["--data-dir", str(tmp_path / "w"), "--private-prefix", prefix]
    result = CliRunner().invoke(app, argv)
    assert result.exit_code == 2
    assert "--private-prefix" in result.output
    assert not (tmp_path / "w").exists()  # refused before anything was made


def test_the_default_and_a_random_ula_48_are_taken() -> None:
    assert private_prefix_error(DEFAULT_PRIVATE_PREFIX) is None
    assert private_prefix_error("fd12:3456:789a::/48") is None
