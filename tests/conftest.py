"""Suite-wide hooks."""

from __future__ import annotations

import logging
import os
import re
import shutil
import subprocess
import tempfile
import types
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
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


@dataclass(frozen=True)
class Need:
    """How a test shows it needs something of the host: a name its code, or its fixtures' code,
    refers to (`names`); a module its own module holds (`modules`, by prefix); a reason of one
    of its skip marks (`reasons`)."""

    names: frozenset[str] = frozenset()
    modules: tuple[str, ...] = ()
    reasons: re.Pattern[str] | None = None


# The markers (declared in pyproject.toml) put on each test from what it uses, not written in
# test files: a test keeps its markers wherever it moves, and a new one gets them by itself.
# `pytest -m "not (root or netns or registry or browser)"` runs what any host can.
NEEDS = {
    "root": Need(reasons=re.compile(r"\broot\b")),
    "netns": Need(
        names=frozenset({"bed_findings", "NetBed", "unshare"}),
        modules=("souk.worker.oci.network",),
    ),
    "registry": Need(names=frozenset({"registry_or_skip"})),
    "browser": Need(names=frozenset({"sync_playwright"}), modules=("playwright",)),
}
IMPLIED = {"netns": "root"}  # namespaces of its own: made by root


def _code_names(code: types.CodeType) -> Iterator[str]:
    """The names a function's code refers to, and its string constants (a program it runs)."""
    yield from code.co_names
    for const in code.co_consts:
        if isinstance(const, str):
            yield const
        elif isinstance(const, types.CodeType):  # closures, comprehensions
            yield from _code_names(const)


def _functions(item: pytest.Function) -> Iterable[object]:
    yield item.function
    for defs in item._fixtureinfo.name2fixturedefs.values():
        for fixturedef in defs:
            yield fixturedef.func


def needs(item: pytest.Function) -> set[str]:
    """The markers of NEEDS that `item` shows it needs."""
    names: set[str] = set()
    for function in _functions(item):
        code = getattr(getattr(function, "__wrapped__", function), "__code__", None)
        if code is not None:
            names.update(_code_names(code))
    modules = [
        value.__name__
        for value in vars(item.module).values()
        if isinstance(value, types.ModuleType)
    ]
    reasons = [str(mark.kwargs.get("reason", "")) for mark in item.iter_markers("skipif")]
    found = set()
    for marker, need in NEEDS.items():
        if (
            names & need.names
            or any(m.startswith(need.modules) for m in modules if need.modules)
            or (need.reasons is not None and any(need.reasons.search(r) for r in reasons))
        ):
            found.add(marker)
    return found | {IMPLIED[m] for m in found if m in IMPLIED}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if isinstance(item, pytest.Function):
            for marker in sorted(needs(item) - {m.name for m in item.iter_markers()}):
                item.add_marker(marker)


def pytest_unconfigure(config: pytest.Config) -> None:
    # Machines outlive the in-process workers that started them, as they outlive a worker on a
    # real host. One that exits once the run is over makes asyncio's child watcher warn that the
    # test's loop is closed, below pytest's summary; nothing is left to report by then.
    logging.getLogger("asyncio").setLevel(logging.ERROR)
