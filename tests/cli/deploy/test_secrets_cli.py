"""`souk secrets set|list|unset` against a real local cluster: values in (from arguments or
stdin), names and digests out, never a value."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from souk.cli.main import app as souk_app
from souk.cli.secrets import parse_pairs
from tests.support.dev import Dev

pytestmark = pytest.mark.integration


def test_set_from_arguments_and_stdin_list_and_unset(dev: Dev) -> None:
    dev.call("POST", "/v1/apps", {"name": "secrets-cli"})
    try:
        runner = CliRunner()
        args = ["secrets", "set", "-a", "secrets-cli", "A=1", "PASSWORD=-", "--json"]
        result = runner.invoke(souk_app, args, env=dev.env(), input="hunter2-long\n")
        assert result.exit_code == 0, result.output
        assert [s["name"] for s in json.loads(result.stdout)] == ["A", "PASSWORD"]
        assert "hunter2-long" not in result.output

        listed = dev.souk("secrets", "list", "-a", "secrets-cli", "--json")
        assert listed.exit_code == 0 and "hunter2-long" not in listed.output
        (_, password) = json.loads(listed.stdout)
        assert set(password) == {"name", "digest", "created_at", "updated_at"}
        # stdin's value without its newline: the same value set again keeps its digest
        again = dev.call("POST", "/v1/apps/secrets-cli/secrets/PASSWORD", {"value": "hunter2-long"})
        assert again["digest"] == password["digest"]

        gone = dev.souk("secrets", "unset", "-a", "secrets-cli", "A", "--json")
        assert gone.exit_code == 0 and [s["name"] for s in json.loads(gone.stdout)] == ["PASSWORD"]
        bad = dev.souk("secrets", "set", "-a", "secrets-cli", "NOVALUE")
        assert bad.exit_code != 0 and "NAME=VALUE" in bad.output
        refused = dev.souk("secrets", "set", "-a", "secrets-cli", "1X=y")
        assert refused.exit_code != 0 and "bad secret name" in refused.output
    finally:
        dev.call("DELETE", "/v1/apps/secrets-cli")


def test_pairs_take_one_value_from_stdin() -> None:
    assert parse_pairs(["A=x=y", "B="]) == {"A": "x=y", "B": ""}
    assert parse_pairs(["K=-"], stdin="v\n") == {"K": "v"}
    with pytest.raises(Exception, match="only one"):
        parse_pairs(["K=-", "L=-"], stdin="v")
