"""`souk deploy` checks its whole plan before it makes anything: a region the cluster does not
have, a guest no region can hold, an image no worker can pin. Each stops the deploy with every
problem named, and leaves no app and no machine behind."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.cli.conftest import souk
from tests.support.dev import Dev
from tests.support.hello import HELLO

pytestmark = pytest.mark.integration


def souk_toml(folder: Path, app: str, regions: str, memory_mb: int = 128, image: str = "") -> Path:
    run = f'image = "{image}"' if image else f"command = {json.dumps([sys.executable, str(HELLO)])}"
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "souk.toml"
    path.write_text(
        f'app = "{app}"\n{run}\nregions = {{ {regions} }}\n\n[guest]\ncpus = 1\n'
        f"memory_mb = {memory_mb}\n"
    )
    return path


def apps(dev: Dev) -> list[str]:
    return [a["name"] for a in dev.call("GET", "/v1/apps")["apps"]]


def test_a_region_typo_is_refused_before_any_machine_is_made(dev: Dev, project: Path) -> None:
    folder = project / "typo"
    souk_toml(folder, "typo", "mad = 1, amss = 1, sinn = 1")
    done = souk("deploy", cwd=folder)
    assert done.returncode != 0
    assert "no region 'amss'" in done.stderr and "no region 'sinn'" in done.stderr, done.stderr
    assert "ams" in done.stderr  # the regions it has
    assert "typo" not in apps(dev)


def test_a_guest_no_region_can_hold_is_refused_first(dev: Dev, project: Path) -> None:
    folder = project / "huge"
    souk_toml(folder, "huge", "mad = 1", memory_mb=1 << 21)
    done = souk("deploy", cwd=folder)
    assert done.returncode != 0
    assert "regions.mad: room for 0 machine(s)" in done.stderr, done.stderr
    assert "huge" not in apps(dev)


def test_an_image_no_worker_can_pin_leaves_no_app(dev: Dev, project: Path) -> None:
    folder = project / "noimage"
    souk_toml(folder, "noimage", "mad = 1", image="127.0.0.1:9/nothing/here:1")
    done = souk("deploy", cwd=folder)
    assert done.returncode != 0
    assert "127.0.0.1:9/nothing/here:1" in done.stderr, done.stderr
    assert "noimage" not in apps(dev)
