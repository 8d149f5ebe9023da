"""The bus's configuration: nodes, their permissions by role, and a file nats-server accepts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from typer.testing import CliRunner

from souk.catalog.bus import subject_matches
from souk.catalog.permissions import ConfigError, Node, parse_node, permissions, render
from souk.catalog.protocol import changes_subject, heartbeat_subject, pull_subject
from souk.cli.main import app
from tests.catalog.pki import Ca


def allowed(node: Node, kind: str, subject: str) -> bool:
    return any(subject_matches(p, subject) for p in permissions(node)[kind]["allow"])


def test_nodes_are_read_strictly() -> None:
    assert parse_node("worker:w1@mad") == Node("worker", "w1", "mad")
    assert parse_node("broker:b1") == Node("broker", "b1")
    for bad in ("w1", "king:w1", "broker:b1@mad", "worker:"):
        with pytest.raises(ConfigError):
            parse_node(bad)


def test_each_role_publishes_and_reads_only_what_it_needs() -> None:
    w1, b1, p1 = Node("worker", "w1", "mad"), Node("broker", "b1"), Node("proxy", "p1")
    assert allowed(w1, "publish", changes_subject("mad", "w1"))
    assert allowed(w1, "publish", heartbeat_subject("mad", "w1"))
    for subject in (changes_subject("mad", "w2"), changes_subject("ams", "w1"), "souk.cat.snap"):
        assert not allowed(w1, "publish", subject)
    assert not allowed(w1, "subscribe", changes_subject("mad", "w2"))
    assert allowed(w1, "subscribe", pull_subject("w1"))
    assert not allowed(w1, "subscribe", pull_subject("w2"))
    assert allowed(w1, "subscribe", "souk.offers.mad") and not allowed(
        w1, "subscribe", "souk.offers.ams"
    )
    assert allowed(b1, "publish", changes_subject("global", "app-registry"))
    assert not allowed(b1, "publish", changes_subject("mad", "w1"))
    assert allowed(b1, "publish", "souk.offers.ams") and not allowed(
        p1, "publish", "souk.offers.ams"
    )
    for node in (b1, p1):
        assert allowed(node, "subscribe", changes_subject("mad", "w1"))
        assert not allowed(node, "subscribe", pull_subject("w1"))
        assert allowed(node, "subscribe", f"_INBOX.{node.role}.{node.name}.x")
        assert not allowed(node, "subscribe", "_INBOX.worker.w1.x")


def test_souk_nats_config_writes_a_file_nats_server_accepts(tmp_path: Path) -> None:
    ca = Ca()
    ca_path = ca.write(tmp_path)
    cert, key = ca.node("bus", "localhost").write(tmp_path)
    out = tmp_path / "nats.conf"
    runner = CliRunner()
    args = ["nats", "config", "--ca", str(ca_path), "--server-cert", str(cert)]
    args += ["--server-key", str(key), "--out", str(out), "--port", "14222"]
    result = runner.invoke(app, [*args, "--node", "worker:w1@mad", "--node", "broker:b1"])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert '"souk://worker/w1"' in text and "verify_and_map: true" in text
    assert runner.invoke(app, [*args, "--node", "king:k1"]).exit_code == 2
    assert runner.invoke(app, args).exit_code == 2  # no nodes
    with pytest.raises(ConfigError):
        render([Node("proxy", "p1"), Node("proxy", "p1")], ca_path, cert, key)
    server = shutil.which("nats-server")
    if server is not None:
        check = subprocess.run([server, "-t", "-c", str(out)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr
