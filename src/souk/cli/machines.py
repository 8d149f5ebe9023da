"""`souk machines` and `souk apps`: the Machines API from a terminal (Rich tables, or --json)."""

from __future__ import annotations

import json
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import typer
from pydantic import ValidationError

from souk.cli.client import AppOption, Broker, JsonOption, OnApp, broker, on_app
from souk.cli.command import CommandError, problems, show
from souk.cli.options import grouped
from souk.clients.machines import MachinesApiError, MachinesClient
from souk.models.api import CreateAppRequest, CreateMachineRequest, PublicMachine
from souk.models.guest import GuestConfig
from souk.models.machine import MachineState
from souk.models.machine_config import InitConfig, MachineConfig

machines = typer.Typer(help="Run and manage machines.", no_args_is_help=True)
apps = typer.Typer(help="Create, list and destroy apps.", no_args_is_help=True)

COLUMNS = ["id", "name", "state", "region", "worker", "cpus", "memory_mb", "command"]
APP_COLUMNS = ["name", "machine_count", "created_at"]


def _flat(m: PublicMachine) -> dict[str, Any]:
    return {
        **m.model_dump(mode="json"),
        "cpus": m.config.guest.cpus,
        "memory_mb": m.config.guest.memory_mb,
        "command": shown_command(m.config),
    }


def shown_command(config: MachineConfig) -> str:
    """What the machine runs, as a person reads it: its command, else its image with the
    entrypoint and cmd given over the image's own."""
    if config.init.exec or not config.image:
        return " ".join(config.argv())
    given = [*(config.init.entrypoint or []), *(config.init.cmd or [])]
    return " ".join([config.image, *given])


def _one(m: PublicMachine, as_json: bool) -> None:
    if as_json:
        print(json.dumps(m.model_dump(mode="json"), indent=2))
    else:
        show([_flat(m)], COLUMNS, False)


@machines.command("run")
@grouped(on=on_app)
def run_machine(
    command: list[str] = typer.Argument(..., help="The command, after --."),
    region: str = typer.Option(..., "--region", "-r", help="The one region to place it in."),
    name: str | None = typer.Option(None, help="A name for the machine."),
    cpus: int = typer.Option(1, help="CPUs."),
    memory_mb: int = typer.Option(256, help="Memory in MB."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE (repeatable)."),
    strategy: str = typer.Option("auto", help="auto, offers, p2c or catalog."),
    *,
    on: OnApp,
) -> None:
    """Place and start a machine running COMMAND: `souk machines run -r mad -- sleep 60`."""
    try:
        req = CreateMachineRequest(
            region=region,
            name=name,
            config=MachineConfig(
                init=InitConfig(exec=command),
                guest=GuestConfig(cpus=cpus, memory_mb=memory_mb),
                env=dict(e.split("=", 1) for e in env if "=" in e),
            ),
        )
    except ValidationError as exc:
        raise typer.BadParameter(problems(exc)) from None
    _one(on.call(lambda c: c.create(on.app, req, strategy)), on.as_json)


@machines.command("list")
@grouped(on=on_app)
def list_(
    region: str | None = typer.Option(None, help="Only this region."),
    state: str | None = typer.Option(None, help="Only these states, comma-separated."),
    all_: bool = typer.Option(False, "--all", help="Include destroyed machines."),
    *,
    on: OnApp,
) -> None:
    """List an app's machines."""
    states = [s for s in (state or "").split(",") if s]
    rows = on.call(lambda c: c.machines(on.app, region, states, all_))
    show([_flat(m) for m in rows], COLUMNS, on.as_json, title=f"machines of {on.app}")


WHY_COLUMNS = ["worker", "outcome", "score", "rank", "cpus_free", "memory_mb_free", "reason"]


@machines.command("why")
@grouped(on=on_app)
def why(machine_id: str, *, on: OnApp) -> None:
    """Why a machine is where it is: every worker looked at, its score or why it refused.
    Operator tokens; only the broker that placed the machine knows (docs/observability.md)."""
    found = on.call(lambda c: c.placement(on.app, machine_id))
    if on.as_json:
        print(json.dumps(found.model_dump(mode="json"), indent=2))
        return
    rows = [
        {k: "" if v is None else v for k, v in c.model_dump().items()} for c in found.candidates
    ]
    title = (
        f"{found.machine} placed on {found.winner} in {found.region}"
        f" ({found.strategy} strategy, {found.policy} policy, {found.took_ms:.1f} ms)"
    )
    show(rows, WHY_COLUMNS, False, title=title)


@machines.command("status")
@grouped(on=on_app)
def status(machine_id: str, *, on: OnApp) -> None:
    """One machine."""
    _one(on.call(lambda c: c.machine(on.app, machine_id)), on.as_json)


Action = Callable[[MachinesClient, str, str], Awaitable[PublicMachine]]

WAIT = 120.0  # seconds a start, stop or destroy waits for its state (a stop's timeout and more)
DETACH = typer.Option(
    False, "--detach", help="Return once the broker has the request, without waiting."
)


async def acted(
    client: MachinesClient,
    act: Action,
    app: str,
    machine_id: str,
    state: MachineState,
    detach: bool,
) -> PublicMachine:
    """The machine after `act`, once it is in `state` (as flyctl waits): a command that
    returns has done what it says, so the next one (a volume extend after a stop) finds it
    done. With `detach`, the broker's answer at once."""
    answered = await act(client, app, machine_id)
    if detach:
        return answered
    if not await client.wait(app, machine_id, state, WAIT):
        now = await client.machine(app, machine_id)
        raise CommandError(
            f"machine {machine_id} is {now.state}, not {state}, after {WAIT:g}s"
            " (--detach returns at once)"
        )
    try:
        return await client.machine(app, machine_id)
    except MachinesApiError as exc:
        if exc.http_status != 404:
            raise
        return answered.model_copy(update={"state": state})  # already gone from the list


def _verb(verb: str, act: Action, state: MachineState, doc: str) -> None:
    """`souk machines start|stop ID`: one command for each verb."""

    def command(machine_id: str, detach: bool = DETACH, *, on: OnApp) -> None:
        found = on.call(lambda c: acted(c, act, on.app, machine_id, state, detach))
        _one(found, on.as_json)

    command.__doc__ = doc
    machines.command(verb)(grouped(on=on_app)(command))


_verb("start", MachinesClient.start, "started", "Start a stopped machine; waits until it runs.")
_verb(
    "stop",
    MachinesClient.stop,
    "stopped",
    "Stop a machine (its stop signal, then SIGKILL after its timeout); waits until it is stopped.",
)


@machines.command("destroy")
@grouped(on=on_app)
def destroy(
    machine_id: str,
    force: bool = typer.Option(False, "--force", help="Even if it is running (it is killed)."),
    detach: bool = DETACH,
    *,
    on: OnApp,
) -> None:
    """Destroy a machine and release its reservation; waits until it is destroyed."""

    async def act(c: MachinesClient, app: str, mid: str) -> PublicMachine:
        try:
            return await c.destroy(app, mid, force=force)
        except MachinesApiError as exc:
            if exc.reason != "failed_precondition":
                raise
            raise CommandError(
                f"machine {mid} is running: stop it first, or destroy it with --force"
                " (it is killed)"
            ) from None

    found = on.call(lambda c: acted(c, act, on.app, machine_id, "destroyed", detach))
    _one(found, on.as_json)


@machines.command("logs")
@grouped(broker=broker)
def logs(
    machine_id: str,
    app: AppOption = "demo",
    stderr: bool = typer.Option(False, help="stderr instead of stdout."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming."),
    *,
    broker: Broker,
) -> None:
    """A machine's output."""
    stream = "stderr" if stderr else "stdout"

    async def copy(client: MachinesClient) -> None:
        async for chunk in client.stream_logs(app, machine_id, stream, follow):
            sys.stdout.buffer.write(chunk)
            sys.stdout.buffer.flush()

    broker.call(copy)


@apps.command("create")
@grouped(broker=broker)
def create_app(
    name: str,
    org: str = typer.Option("personal", help="Organisation slug."),
    *,
    broker: Broker,
    as_json: JsonOption = False,
) -> None:
    """Create an app."""
    try:
        req = CreateAppRequest(name=name, org_slug=org)
    except ValidationError as exc:
        raise typer.BadParameter(problems(exc)) from None
    app = broker.call(lambda c: c.create_app(req))
    show([app.model_dump(mode="json")], APP_COLUMNS, as_json)


@apps.command("list")
@grouped(broker=broker)
def list_apps(*, broker: Broker, as_json: JsonOption = False) -> None:
    """Apps this token can see."""
    data = broker.call(lambda c: c.apps())
    rows = [a.model_dump(mode="json") for a in data.apps]
    show(rows, APP_COLUMNS, as_json, title="apps")


@apps.command("destroy")
@grouped(broker=broker)
def destroy_app(name: str, *, broker: Broker, as_json: JsonOption = False) -> None:
    """Delete an app that has no machines left."""
    broker.call(lambda c: c.delete_app(name))
    if as_json:
        print(json.dumps({"deleted": name}))
    else:
        print(f"deleted app {name}")
