"""Suite-wide hooks."""

from __future__ import annotations

import logging
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from souk.models.wire import DEFAULT_PRIVATE_PREFIX
from souk.worker.oci.network import resolver

DEFAULT_RESOLVER = resolver(DEFAULT_PRIVATE_PREFIX)

pytest_plugins = ["tests.support.cgroups"]  # the `cgroups` fixture

_private_temp: list[Path] = []
# What root workers add to this host's network for the private network (docs/network.md), and
# whether the run found it there: what it added itself is removed at its end.
_TABLE = ["nft", "list", "table", "inet", "souk"]
_found: dict[str, bool] = {}


def _host_network() -> dict[str, bool]:
    if os.geteuid() != 0 or shutil.which("nft") is None:
        return {}
    table = subprocess.run(_TABLE, capture_output=True, check=False).returncode == 0
    lo = subprocess.run(["ip", "-6", "addr", "show", "dev", "lo"], capture_output=True, text=True)
    return {"table": table, "resolver": f"{DEFAULT_RESOLVER}/128" in lo.stdout}


def _host_network_as_found() -> None:
    now = _host_network()
    if now.get("table") and not _found.get("table"):
        subprocess.run(["nft", "delete", "table", "inet", "souk"], capture_output=True)
    if now.get("resolver") and not _found.get("resolver"):
        argv = ["ip", "-6", "addr", "del", f"{DEFAULT_RESOLVER}/128", "dev", "lo"]
        subprocess.run(argv, capture_output=True)


@pytest.hookimpl(tryfirst=True)
def pytest_configure(config: pytest.Config) -> None:
    # A root worker runs machines as their apps' own users, in directories below its data dir:
    # those users must be able to pass through (not list) the temporary directories above. Every
    # pytest run makes its shared /tmp/pytest-of-root private again, so a root run gets a
    # temporary root of its own instead (removed when the run passes).
    if os.geteuid() == 0 and config.option.basetemp is None:
        root = Path(tempfile.mkdtemp(prefix="souk-tests-"))
        root.chmod(0o711)
        config.option.basetemp = str(root / "run")
        _private_temp.append(root)
    if not hasattr(config, "workerinput"):
        _found.update(_host_network())


def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    if not hasattr(session.config, "workerinput"):  # the run's end, not one xdist worker's
        _host_network_as_found()
    if exitstatus == 0:
        for root in _private_temp:
            shutil.rmtree(root, ignore_errors=True)


@pytest.fixture(scope="session", autouse=True)
def _temp_dirs_reachable(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """Every temporary directory open to others for passing through (pytest makes them 0700)."""

    def reachable(path: Path) -> Path:
        path.chmod(path.stat().st_mode | 0o001)
        return path

    base = tmp_path_factory.getbasetemp()
    reachable(base)
    for above in base.parents:  # under xdist, each worker's base is a level below the run's
        if above.name.startswith("souk-tests-") or above == Path(tempfile.gettempdir()):
            break
        reachable(above)
    mktemp = tmp_path_factory.mktemp

    def mktemp_reachable(basename: str, numbered: bool = True) -> Path:
        return reachable(mktemp(basename, numbered))

    tmp_path_factory.mktemp = mktemp_reachable  # type: ignore[method-assign]
    yield


def pytest_unconfigure(config: pytest.Config) -> None:
    # Machines outlive the in-process workers that started them, as they outlive a worker on a
    # real host. One that exits once the run is over makes asyncio's child watcher warn that the
    # test's loop is closed, below pytest's summary; nothing is left to report by then.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
