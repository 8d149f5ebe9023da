"""`souk mesh show` and `souk mesh rotate`: a node's mesh key, read and replaced as an operator
does it, with the `souk` program."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from souk.network.mesh import KEY_FILE, load_key
from tests.cli.conftest import souk


def test_rotate_writes_a_new_key_0600_and_says_both_public_keys(tmp_path: Path) -> None:
    private, public = load_key(tmp_path / KEY_FILE)  # as a node makes it at its first start
    shown = souk("mesh", "show", "--dir", str(tmp_path), cwd=tmp_path)
    assert shown.returncode == 0 and shown.stdout.strip() == public
    done = souk("mesh", "rotate", "--dir", str(tmp_path), "--json", cwd=tmp_path)
    assert done.returncode == 0, done.stderr
    said = json.loads(done.stdout)
    assert said["old_public_key"] == public and said["public_key"] != public
    path = tmp_path / KEY_FILE
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    assert path.read_text().strip() != private
    assert load_key(path)[1] == said["public_key"]  # the file holds the key it announced


def test_a_directory_without_a_key_is_refused_not_given_one(tmp_path: Path) -> None:
    done = souk("mesh", "rotate", "--dir", str(tmp_path), cwd=tmp_path)
    assert done.returncode == 2
    assert f"no {KEY_FILE} in" in done.stderr
    assert not (tmp_path / KEY_FILE).exists()
