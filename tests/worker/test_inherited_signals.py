"""A worker started with signals ignored (`nohup`, a shell's background job) passes none of
that on: its machines can trap those signals and be stopped by them."""

from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from souk.models.machine import CreateMachine, MachineConfig
from souk.worker.inherited_signals import catch_ignored
from tests.support.engines import engine as started_engine
from tests.support.waiting import eventually

CHILD = textwrap.dedent(
    """
    import os, signal, subprocess
    from souk.worker.inherited_signals import catch_ignored
    for sig in (signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_IGN)  # as nohup, and a background job, start a worker
    if os.environ["CATCH"] == "1":
        catch_ignored()
    os.kill(os.getpid(), signal.SIGHUP)  # the worker itself is still deaf to it
    for sig in ("HUP", "QUIT"):
        code = subprocess.run(["sh", "-c", f"kill -{sig} $$; sleep 0.2"]).returncode
        print(code, flush=True)
    """
)


def _run(catch: bool) -> list[int]:
    env = {"PATH": "/usr/bin:/bin", "CATCH": "1" if catch else "0"}
    out = subprocess.run(
        [sys.executable, "-c", CHILD], env=env, capture_output=True, text=True, timeout=30
    )
    assert out.returncode == 0, out.stderr
    return [int(line) for line in out.stdout.split()]


def test_the_children_of_a_worker_started_ignoring_signals_get_their_defaults() -> None:
    assert _run(catch=False) == [0, 0]  # inherited: the shell ignored its own kill
    assert _run(catch=True) == [-signal.SIGHUP, -signal.SIGQUIT]


@pytest.fixture
def started_under_nohup() -> Iterator[None]:
    before = signal.signal(signal.SIGHUP, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGHUP, before)


@pytest.mark.usefixtures("started_under_nohup")
async def test_a_machine_of_a_worker_started_under_nohup_traps_sighup(tmp_path: Path) -> None:
    script = 'trap "echo hup >> got" HUP; : > ready; while :; do sleep 0.02; done'
    async with started_engine(tmp_path, "process") as engine:
        config = MachineConfig.model_validate({"init": {"exec": ["sh", "-c", script]}})
        m = await engine.create(CreateMachine(app="demo", config=config, start=True))
        home = engine.settings.data_dir / "apps" / m.app / m.id
        assert (await engine.wait(m.id, "started", 10, None))[0]  # the spawn's commit is
        await eventually((home / "ready").exists)  # not the create's: a moment later
        await engine.signal(m.id, "SIGHUP")
        await eventually(lambda: (home / "got").exists() and "hup" in (home / "got").read_text())


def test_catching_changes_only_what_was_ignored() -> None:
    before = signal.getsignal(signal.SIGUSR2)
    assert before is not signal.SIG_IGN
    assert int(signal.SIGUSR2) not in catch_ignored()
    assert signal.getsignal(signal.SIGUSR2) is before
