"""`--no-metrics` on `souk worker`, `souk broker` and `souk proxy` reaches the settings their
parts are built from (nothing is served: `serve` is replaced)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from souk.cli.main import app

LOOPBACK = "http://127.0.0.1:1"
WORKER = [
    "--name",
    "w1",
    "--region",
    "mad",
    "--data-dir",
    "DIR",
    "--cpus",
    "1",
    "--memory-mb",
    "64",
]
COMMANDS = {  # command: where its `serve` is looked up, and the arguments it needs
    "worker": ("souk.cli.worker.serve", WORKER),
    "broker": ("souk.broker.runtime.serve", ["--secret-file", "DIR/secret", "--worker", LOOPBACK]),
    "proxy": ("souk.proxy.server.serve", ["--nats", "nats://127.0.0.1:1", "--token", "t"]),
}


@pytest.mark.parametrize("command", sorted(COMMANDS))
@pytest.mark.parametrize("flag,expected", [([], True), (["--no-metrics"], False)])
def test_the_metrics_switch_reaches_the_settings(
    command: str, flag: list[str], expected: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    target, needed = COMMANDS[command]
    served: list[Any] = []

    async def serve(settings: Any, *_: Any) -> None:
        served.append(settings)

    monkeypatch.setattr(target, serve)
    monkeypatch.setattr(f"souk.cli.{command}.log_to_stderr", lambda *_: None)
    (tmp_path / "secret").write_bytes(b"s" * 32)
    args = [a.replace("DIR", str(tmp_path)) for a in needed]
    result = CliRunner().invoke(app, [command, *args, *flag])
    assert result.exit_code == 0, result.output
    assert [s.metrics for s in served] == [expected]
