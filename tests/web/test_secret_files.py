"""Files holding secrets are 0600 from the moment they exist, whoever writes them."""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from souk.broker.tokens import verify
from souk.cli.main import app
from souk.dev import dev_cluster
from souk.node.cluster_secret import read_secret
from souk.secret_files import fsync_path, write_secret


@pytest.fixture
def open_umask() -> Iterator[None]:
    """The most permissive umask: a writer that relies on it would leave 0666 files."""
    old = os.umask(0)
    try:
        yield
    finally:
        os.umask(old)


def mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_write_secret_creates_and_replaces_as_0600(tmp_path: Path, open_umask: None) -> None:
    path = tmp_path / "secret"
    write_secret(path, b"one")
    assert (path.read_bytes(), mode(path)) == (b"one", 0o600)
    path.chmod(0o644)  # e.g. written by an older version
    write_secret(path, "two")
    assert (path.read_text(), mode(path)) == ("two", 0o600)
    with pytest.raises(FileExistsError):
        write_secret(path, b"three", replace=False)
    assert path.read_text() == "two"
    assert [p.name for p in tmp_path.iterdir()] == ["secret"]  # no temporary file left


def test_souk_tokens_secret_writes_0600(tmp_path: Path, open_umask: None) -> None:
    out = tmp_path / "secret"
    runner = CliRunner()
    result = runner.invoke(app, ["tokens", "secret", "--out", str(out)])
    assert result.exit_code == 0, result.output
    assert mode(out) == 0o600 and len(read_secret(out)) == 64
    first = out.read_bytes()
    result = runner.invoke(app, ["tokens", "secret", "--out", str(out)])
    assert result.exit_code != 0 and out.read_bytes() == first
    out.chmod(0o644)
    result = runner.invoke(app, ["tokens", "secret", "--out", str(out), "--force"])
    assert result.exit_code == 0 and mode(out) == 0o600 and out.read_bytes() != first


async def test_souk_dev_writes_its_operator_token_and_secret_0600(
    tmp_path: Path, open_umask: None
) -> None:
    async with dev_cluster(tmp_path, port=0, proxy_port=0, driver="sim") as dev:
        token = tmp_path / "token"
        assert token.read_text().strip() == dev.token
        assert mode(token) == 0o600 and mode(tmp_path / "secret") == 0o600
        assert verify(dev.token, read_secret(tmp_path / "secret")).operator


def test_fsync_path_syncs_files_and_directories_and_names_a_missing_one(tmp_path: Path) -> None:
    """A missing path is the caller's to judge (a log not made yet, say): it is raised, not
    passed over."""
    (tmp_path / "file").write_bytes(b"x")
    fsync_path(tmp_path / "file")
    fsync_path(tmp_path)
    with pytest.raises(FileNotFoundError):
        fsync_path(tmp_path / "absent")
