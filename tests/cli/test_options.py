"""Options declared once as a group (`souk.cli.options.grouped`): a command gets the group's
result for them, in one parameter; its flags, defaults and checks are the group's, nested
groups included."""

from __future__ import annotations

from typing import Annotated

import typer
from typer.testing import CliRunner

from souk.cli.options import grouped
from souk.cli.serving import Logging, Part, listener, part_options
from souk.web.listener import DEFAULT_LIMITS, Limits


def pair(
    left: Annotated[int, typer.Option(min=0)] = 1, right: Annotated[str, typer.Option()] = "r"
) -> tuple[int, str]:
    return (left, right)


def test_a_groups_options_reach_the_command_as_its_result() -> None:
    got: list[object] = []
    app = typer.Typer()

    @app.command()
    @grouped(both=pair)
    def command(name: str, *, both: tuple[int, str], last: bool = False) -> None:
        got.append((name, both, last))

    runner = CliRunner()
    assert runner.invoke(app, ["n", "--left", "3", "--last"]).exit_code == 0
    assert runner.invoke(app, ["n"]).exit_code == 0
    refused = runner.invoke(app, ["n", "--left", "-1"])  # the group's own check
    assert refused.exit_code == 2
    assert got == [("n", (3, "r"), True), ("n", (1, "r"), False)]
    assert "--right" in runner.invoke(app, ["--help"]).output


def test_a_parts_options_are_groups_of_groups() -> None:
    got: list[Part | Limits] = []
    app = typer.Typer()

    @app.command("part")
    @grouped(part=part_options)
    def part(*, part: Part) -> None:
        got.append(part)

    @app.command("dev")
    @grouped(limits=listener)
    def dev(*, limits: Limits) -> None:
        got.append(limits)

    runner = CliRunner()
    flags = ["--no-metrics", "--max-connections", "7", "--log-level", "debug"]
    assert runner.invoke(app, ["part", *flags]).exit_code == 0
    assert runner.invoke(app, ["dev", "--head-timeout", "2.5"]).exit_code == 0
    shown = runner.invoke(app, ["part", "--max-connections", "9", "--print-config"])
    assert shown.exit_code == 0 and "max-connections = 9" in shown.output
    assert got == [
        Part(False, Limits(7, DEFAULT_LIMITS.max_per_client, 10.0, 75.0), Logging("debug", "text")),
        Limits(DEFAULT_LIMITS.max_connections, DEFAULT_LIMITS.max_per_client, 2.5, 75.0),
    ]
