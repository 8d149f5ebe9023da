"""The CLI finds `souk dev`'s broker and token from the directory it ran in and any below it,
as the README's first command after `scripts/dev.sh` (`cd examples/hello && souk deploy`)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.cli.conftest import souk
from tests.support.dev import Dev

pytestmark = pytest.mark.integration


def test_commands_below_souk_devs_directory_find_its_api_and_token(dev: Dev, project: Path) -> None:
    below = project / "examples" / "hello"
    below.mkdir(parents=True)
    for cwd in (project, below):
        done = souk("apps", "list", "--json", cwd=cwd)
        assert done.returncode == 0, done.stderr
        assert isinstance(json.loads(done.stdout), list)


def test_elsewhere_the_missing_token_says_where_it_is_looked_for(tmp_path: Path) -> None:
    done = souk("apps", "list", cwd=tmp_path)
    assert done.returncode != 0
    assert "no token" in done.stderr and ".souk-dev" in done.stderr, done.stderr
