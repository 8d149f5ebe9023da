"""One `souk dev` for the session, run in a project directory as a user runs it (its data dir
`.souk-dev/` below the directory it ran in), and the `souk` program run as a user runs it."""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.support.dev import Dev, souk_dev
from tests.support.worker_process import SOUK


@pytest.fixture(scope="session")
def project(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("project")


@pytest.fixture(scope="session")
def dev(project: Path) -> Iterator[Dev]:
    data = project / ".souk-dev"
    data.mkdir()
    with souk_dev(data) as cluster:
        yield cluster


def souk(
    *args: str, cwd: Path, env: dict[str, str] | None = None, columns: int | None = None
) -> subprocess.CompletedProcess[str]:
    """The `souk` program in `cwd`, without SOUK_* from the test's own environment (and, with
    `columns`, as a terminal that wide would run it; piped otherwise)."""
    base = {k: v for k, v in os.environ.items() if not k.startswith("SOUK_")}
    base.pop("COLUMNS", None)
    if columns is not None:
        base["COLUMNS"] = str(columns)
    return subprocess.run(
        [str(SOUK), *args],
        cwd=cwd,
        env={**base, **(env or {})},
        capture_output=True,
        text=True,
        timeout=120,
    )
