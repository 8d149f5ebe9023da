"""`souk ca init`, `souk certs issue` and `souk certs show`, run as the program's commands."""

from __future__ import annotations

import json
import stat
from pathlib import Path

from typer.testing import CliRunner, Result

from souk.cli.main import app
from souk.pki import identity_of, load_cert, verify_issued_by


def souk(*args: str | Path) -> Result:
    return CliRunner().invoke(app, [str(a) for a in args])


def test_ca_then_certificate_then_show(tmp_path: Path):
    ca, out = tmp_path / "ca", tmp_path / "nodes"
    done = souk("ca", "init", "--dir", ca)
    assert done.exit_code == 0, done.output
    assert "valid until" in done.output

    done = souk(
        "certs", "issue", "--ca-dir", ca, "--role", "worker", "--name", "mad-1",
        "--san", "10.1.2.3", "--san", "mad-1.example", "--days", "7", "--out", out, "--json",
    )  # fmt: skip
    assert done.exit_code == 0, done.output
    summary = json.loads(done.output)
    assert summary["uri"] == "souk://worker/mad-1"
    assert summary["dns"] == ["mad-1", "mad-1.example"]
    assert summary["ip"] == ["10.1.2.3"]
    cert = load_cert(Path(summary["cert"]))
    verify_issued_by(cert, load_cert(ca / "ca.crt"))
    assert identity_of(cert).name == "mad-1"
    assert (cert.not_valid_after_utc - cert.not_valid_before_utc).days == 7  # and 5 minutes
    assert stat.S_IMODE(Path(summary["key"]).stat().st_mode) == 0o600

    shown = souk("certs", "show", summary["cert"], "--ca", ca / "ca.crt", "--json")
    assert shown.exit_code == 0, shown.output
    assert json.loads(shown.output)["serial"] == summary["serial"]


def test_issue_refuses_to_replace_a_key_and_says_how(tmp_path: Path):
    ca, out = tmp_path / "ca", tmp_path / "nodes"
    souk("ca", "init", "--dir", ca)
    args = ("certs", "issue", "--ca-dir", ca, "--role", "proxy", "--name", "p1", "--out", out)
    assert souk(*args).exit_code == 0
    key = (out / "p1.key").read_bytes()

    again = souk(*args)
    assert again.exit_code == 2
    assert "--force" in again.output
    assert (out / "p1.key").read_bytes() == key

    both = souk(*args, "--force", "--reuse-key")
    assert both.exit_code == 2
    assert "pick one" in both.output

    assert souk(*args, "--reuse-key").exit_code == 0
    assert (out / "p1.key").read_bytes() == key
    assert souk(*args, "--force").exit_code == 0
    assert (out / "p1.key").read_bytes() != key


def test_ca_init_refuses_to_replace_a_ca(tmp_path: Path):
    assert souk("ca", "init", "--dir", tmp_path / "ca").exit_code == 0
    again = souk("ca", "init", "--dir", tmp_path / "ca")
    assert again.exit_code == 2
    assert "--force" in again.output


def test_issue_refuses_an_unknown_role(tmp_path: Path):
    souk("ca", "init", "--dir", tmp_path / "ca")
    done = souk(
        "certs", "issue", "--ca-dir", tmp_path / "ca", "--role", "root", "--name", "x",
        "--out", tmp_path / "out",
    )  # fmt: skip
    assert done.exit_code == 2
    assert "unknown role" in done.output
    assert not (tmp_path / "out").exists()


def test_show_fails_for_a_certificate_of_another_ca(tmp_path: Path):
    souk("ca", "init", "--dir", tmp_path / "ca")
    souk("ca", "init", "--dir", tmp_path / "other")
    souk(
        "certs", "issue", "--ca-dir", tmp_path / "other", "--role", "operator", "--name", "ops",
        "--out", tmp_path / "out",
    )  # fmt: skip
    done = souk("certs", "show", tmp_path / "out" / "ops.crt", "--ca", tmp_path / "ca" / "ca.crt")
    assert done.exit_code == 1
    assert "signature is not the CA's" in done.output
    assert souk("certs", "show", tmp_path / "ca" / "ca.crt").exit_code == 1
