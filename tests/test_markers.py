"""The markers tests/conftest.py puts on tests from what they use (`root`, `netns`,
`registry`, `browser`): known tests selected by each, as `pytest -m` selects them in a run of
its own, and a test that needs nothing of the host selected by none."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
REGISTRY = "tests/worker/oci/test_registry.py::test_resolve_by_tag_and_by_digest"
BROWSER = "tests/broker/ui/test_dashboard_browser.py::test_the_dashboard_follows_the_fleet_live"
MESH = "tests/network/test_mesh.py::test_and_by_name"
PLAIN = "tests/network/test_mesh_peers.py::test_an_announcement_is_taken_only_for_a_hosts_address"
FILES = sorted({test.split("::")[0] for test in (REGISTRY, BROWSER, MESH, PLAIN)})


def selected(marker: str) -> set[str]:
    argv = [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:randomly"]
    done = subprocess.run(
        [*argv, "-p", "no:cacheprovider", "-m", marker, *FILES],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode in (0, 5), done.stdout[-2000:] + done.stderr[-2000:]  # 5: none
    return {line.strip() for line in done.stdout.splitlines() if "::" in line}


def test_a_registry_test_is_marked_and_a_plain_one_is_not() -> None:
    found = selected("registry")
    assert REGISTRY in found
    assert MESH not in found and PLAIN not in found


@pytest.mark.skipif(
    importlib.util.find_spec("playwright") is None,
    reason="playwright is not installed: the browser tests are not even collected",
)
def test_a_browser_test_is_marked() -> None:
    found = selected("browser")
    assert found == {BROWSER}


def test_a_test_beds_test_needs_root_and_namespaces_and_a_plain_one_neither() -> None:
    assert MESH in selected("netns and root")
    anywhere = selected("not (root or netns or registry or browser)")
    assert PLAIN in anywhere and MESH not in anywhere and REGISTRY not in anywhere
