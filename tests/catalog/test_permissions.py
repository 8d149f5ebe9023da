"""The bus's configuration: nodes, their permissions by role, and a file nats-server accepts."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest
from cryptography.hazmat.primitives.serialization import Encoding
from typer.testing import CliRunner

from souk.catalog.bus import subject_matches
from souk.catalog.permissions import ConfigError, Node, parse_node, permissions, render
from souk.catalog.protocol import changes_subject, heartbeat_subject, pull_subject
from souk.cli.main import app
from souk.pki import identity_of
from tests.catalog.pki import Ca


def allowed(node: Node, kind: str, subject: str) -> bool:
    return any(subject_matches(p, subject) for p in permissions(node)[kind]["allow"])


def test_nodes_are_read_strictly() -> None:
    assert parse_node("worker:w1@mad") == Node("worker", "w1", "mad")
    assert parse_node("broker:b1") == Node("broker", "b1")
    assert parse_node("worker:mad-1.example") == Node("worker", "mad-1.example")
    for bad in ("w1", "king:w1", "bus:nats-1", "broker:b1@mad", "worker:", "worker:W1"):
        with pytest.raises(ConfigError):
            parse_node(bad)
    # the user nats-server maps a client to is the URI name its certificate carries
    node = Node("worker", "mad-1")
    assert node.user == identity_of(Ca().node("worker", "mad-1").cert).uri


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
    assert allowed(w1, "subscribe", "souk.reserve.w1")
    assert not allowed(w1, "subscribe", "souk.reserve.w2")
    assert not allowed(w1, "publish", "souk.reserve.w2")
    assert allowed(b1, "publish", "souk.reserve.w2") and not allowed(
        p1, "publish", "souk.reserve.w2"
    )
    assert not allowed(b1, "subscribe", "souk.reserve.w2")
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
    bus = ca.node("bus", "nats-1", sans=["127.0.0.1"]).write(tmp_path / "nats-1")
    out = tmp_path / "nats.conf"
    runner = CliRunner()
    args = ["nats", "config", "--tls-dir", str(bus.cert.parent), "--out", str(out)]
    args += ["--port", "14222"]
    result = runner.invoke(app, [*args, "--node", "worker:w1@mad", "--node", "broker:b1"])
    assert result.exit_code == 0, result.output
    text = out.read_text()
    assert '"souk://worker/w1"' in text and "verify_and_map: true" in text
    assert f'cert_file: "{bus.cert}"' in text and f'ca_file: "{bus.ca}"' in text
    assert runner.invoke(app, [*args, "--node", "king:k1"]).exit_code == 2
    assert runner.invoke(app, args).exit_code == 2  # no nodes
    with pytest.raises(ConfigError):
        render([Node("proxy", "p1"), Node("proxy", "p1")], bus)
    server = shutil.which("nats-server")
    if server is not None:
        check = subprocess.run([server, "-t", "-c", str(out)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_souk_nats_config_takes_only_a_bus_certificate_of_the_ca_beside_it(
    tmp_path: Path,
) -> None:
    ca = Ca()
    runner = CliRunner()

    def config(directory: Path, *more: str) -> str:
        args = ["nats", "config", "--tls-dir", str(directory), "--out", str(tmp_path / "x.conf")]
        result = runner.invoke(app, [*args, *more, "--node", "broker:b1"])
        assert result.exit_code == 2
        assert not (tmp_path / "x.conf").exists()
        return " ".join(result.output.split())

    worker = ca.node("worker", "w1").write(tmp_path / "w1")
    assert "certificate of worker w1, not of a bus" in config(worker.cert.parent)
    stranger = Ca().node("bus", "nats-1").write(tmp_path / "stranger")
    stranger.ca.write_bytes(ca.cert.public_bytes(Encoding.PEM))  # another CA's bus certificate
    assert "not the CA's" in config(stranger.cert.parent)
    two = tmp_path / "two"
    ca.node("bus", "nats-1").write(two)
    ca.node("bus", "nats-2").write(two)
    assert "one NAME.key, not nats-1, nats-2" in config(two)
    named = ["--tls-dir", str(two), "--tls-name", "nats-2", "--out", str(tmp_path / "x.conf")]
    ok = runner.invoke(app, ["nats", "config", *named, "--node", "broker:b1"])
    assert ok.exit_code == 0, ok.output
    assert str(two / "nats-2.crt") in (tmp_path / "x.conf").read_text()


def test_souk_catalog_serve_takes_one_way_to_trust_and_checks_its_files(tmp_path: Path) -> None:
    ca = Ca()
    proxy = ca.node("proxy", "cat1").write(tmp_path / "cat1")
    runner = CliRunner()
    serve = ["catalog", "serve", "--nats", "nats://127.0.0.1:1"]
    for choice in (
        [],
        ["--insecure", "--ca", str(proxy.ca)],
        ["--tls-dir", str(tmp_path / "cat1"), "--insecure"],
    ):
        result = runner.invoke(app, [*serve, *choice])
        assert result.exit_code == 2 and "give one of" in " ".join(result.output.split())
    proxy.key.write_bytes(ca.node("proxy", "cat1").write(tmp_path / "other").key.read_bytes())
    result = runner.invoke(app, [*serve, "--tls-dir", str(tmp_path / "cat1")])
    assert result.exit_code == 2 and "is not the key of" in " ".join(result.output.split())
    worker = ca.node("worker", "w1").write(tmp_path / "w1")
    result = runner.invoke(app, [*serve, "--ca", str(worker.cert)])
    assert result.exit_code == 2 and "no CA" in " ".join(result.output.split())
