"""`souk deploy`, `souk releases`, `souk rollback`, `souk scale`, `souk status`, `souk logs`:
platform policy in the client, built only on the broker's public Machines API."""

from __future__ import annotations

import asyncio
import json
import sys
from pathlib import Path
from typing import Annotated, Any, cast, get_args

import typer

from souk.cli.client import Broker, broker
from souk.cli.command import console, fail, run
from souk.cli.command import table as command_table
from souk.cli.deploy import config as cfgmod
from souk.cli.deploy.config import AppConfig, ConfigError, StrategyName
from souk.cli.deploy.errors import DeployError
from souk.cli.deploy.output import Outcome, machine_row, report, table
from souk.cli.deploy.plan import MachineView, sort_fleet
from souk.cli.deploy.progress import Progress
from souk.cli.deploy.releases import AppRecord, RollbackError
from souk.cli.deploy.run import deploy, views
from souk.cli.deploy.secrets import carried
from souk.cli.options import grouped
from souk.clients.machines import MachinesClient

JsonOutput = Annotated[bool, typer.Option("--json", help="Machine-readable output.")]
ConfigFile = Annotated[
    Path, typer.Option("--config", "-c", help="The app's souk.toml.", resolve_path=True)
]
AppName = Annotated[str | None, typer.Option("--app", "-a", help="The app (default: souk.toml's).")]
STRATEGY = typer.Option(None, "--strategy", help="rolling, immediate, canary or bluegreen.")

scale = typer.Typer(help="Change how many instances an app runs.", no_args_is_help=True)


def _app_name(app: str | None, config: Path) -> str:
    """The app a command is about: --app, else souk.toml's."""
    if app:
        return app
    try:
        return cfgmod.load(config).app
    except ConfigError as exc:
        raise typer.BadParameter(f"no app given and {exc}", param_hint="--app") from None


def app_named(config: ConfigFile = Path("souk.toml"), app: AppName = None) -> str:
    """`--config` and `--app` (`grouped(name=app_named)`): the app's name."""
    return _app_name(app, config)


def _strategy(value: str | None) -> StrategyName | None:
    if value is None:
        return None
    if value not in get_args(StrategyName):
        raise typer.BadParameter("rolling, immediate, canary or bluegreen", param_hint="--strategy")
    return cast(StrategyName, value)


async def _deploy(
    broker: Broker,
    cfg: AppConfig,
    progress: Progress,
    strategy: StrategyName | None,
    description: str,
    counts: dict[str, int] | None = None,
    release: int | None = None,
    keep_secrets: bool = False,
) -> Outcome | DeployError:
    async with broker.client() as api:
        try:
            return await deploy(
                api, cfg, progress, strategy, description, counts, release, keep_secrets
            )
        except DeployError as exc:
            return exc


@grouped(broker=broker)
def deploy_command(
    config: ConfigFile = Path("souk.toml"),
    app: AppName = None,
    image: str | None = typer.Option(None, help="Deploy this image instead of souk.toml's."),
    strategy: str | None = STRATEGY,
    message: str = typer.Option("", "--message", "-m", help="A note kept with the release."),
    *,
    broker: Broker,
    as_json: JsonOutput = False,
) -> None:
    """Deploy souk.toml as a new release.

    Per instance one started machine and a stopped standby on another worker of its region,
    rolled out by the chosen strategy; stops at the first machine that fails.
    """
    try:
        cfg = cfgmod.load(config)
        changes: dict[str, Any] = {}
        if app:
            changes["app"] = app
        if image:
            changes["image"], changes["command"] = image, None
        if changes:
            cfg = cfgmod.parse({**cfg.model_dump(mode="json"), **changes})
    except ConfigError as exc:
        fail(str(exc), as_json, exc.code)
    progress = Progress(quiet=as_json)
    result = run(_deploy(broker, cfg, progress, _strategy(strategy), message), as_json)
    report(result, progress, as_json)


@grouped(name=app_named, broker=broker)
def rollback(
    version: int | None = typer.Argument(
        None, help="The release to go back to (default: the previous)."
    ),
    strategy: str | None = STRATEGY,
    *,
    name: str,
    broker: Broker,
    as_json: JsonOutput = False,
) -> None:
    """Deploy an earlier release again, as a new release."""
    progress = Progress(quiet=as_json)

    async def go() -> Outcome | DeployError:
        async with broker.client() as client:
            known = await AppRecord.read(client, name)
            target = known.rollback_target(version)
        cfg = cfgmod.parse({**known.deployable(target), "app": name})
        progress.step(f"rolling back {name} to release {target.version} ({target.what()})")
        why, keep = f"rollback to {target.version}", carried(target)
        if keep:
            progress.step("env: the app's secrets stay as they are now")
        return await _deploy(broker, cfg, progress, _strategy(strategy), why, keep_secrets=keep)

    report(run(go(), as_json), progress, as_json)


@grouped(name=app_named, broker=broker)
def releases_command(*, name: str, broker: Broker, as_json: JsonOutput = False) -> None:
    """The app's releases, newest first."""
    known = broker.call(lambda client: AppRecord.read(client, name), as_json)
    cur = known.current
    rows = known.releases
    if as_json:
        out = [{**r.model_dump(), "current": r.version == cur} for r in rows]
        print(json.dumps(out, indent=2))
        return
    columns = ["version", "status", "strategy", "image / command", "created", "note"]
    cells = []
    for r in rows:
        mark = " (current)" if r.version == cur else ""
        note = r.description + (f" [red]{r.error}[/red]" if r.error else "")
        cells.append([f"{r.version}{mark}", r.status, r.strategy, r.what(), r.created_at, note])
    console().print(command_table(columns, cells, f"releases of {name}"))


@scale.command("count")
@grouped(name=app_named, broker=broker)
def scale_count(
    count: int = typer.Argument(..., min=0, help="Instances wanted in the region."),
    region: str = typer.Option(..., "--region", "-r", help="The region to scale."),
    *,
    name: str,
    broker: Broker,
    as_json: JsonOutput = False,
) -> None:
    """Add or remove instances in one region, on the current release.

    An instance is a primary and its standby. Lasts until the next deploy, which brings
    souk.toml's counts back.
    """
    progress = Progress(quiet=as_json)

    async def go() -> Outcome | DeployError:
        async with broker.client() as client:
            known = await AppRecord.read(client, name)
            cur, record = known.current, known.current_release()
            if cur is None:
                raise RollbackError(f"{name} has no completed release yet: deploy it first")
            if record is None:
                raise RollbackError(f"the record of {name}'s current release {cur} is unreadable")
            machines = await views(client, name)
        cfg = cfgmod.parse({**known.deployable(record), "app": name})
        counts = sort_fleet(machines).counts()
        counts[region] = count
        return await _deploy(broker, cfg, progress, None, "", counts, cur)

    report(run(go(), as_json), progress, as_json)


@grouped(name=app_named, broker=broker)
def status(*, name: str, broker: Broker, as_json: JsonOutput = False) -> None:
    """The app's machines per region and state, their health and release."""

    async def both(client: MachinesClient) -> tuple[AppRecord, list[MachineView]]:
        return await asyncio.gather(AppRecord.read(client, name), views(client, name))

    known, machines = broker.call(both, as_json)
    cur = known.current
    rows = sorted(
        (machine_row(m) for m in machines),
        key=lambda r: (r["region"], r["standby_for"] or r["id"], r["role"] != "primary"),
    )
    regions: dict[str, dict[str, int]] = {}
    for row in rows:
        states = regions.setdefault(row["region"], {})
        states[row["state"]] = states.get(row["state"], 0) + 1
    if as_json:
        print(
            json.dumps(
                {"app": name, "release": cur, "regions": regions, "machines": rows}, indent=2
            )
        )
        return
    out = console()
    out.print(f"[bold]{name}[/bold]: release {cur if cur is not None else '-'}")
    for region, states in sorted(regions.items()):
        out.print(f"  {region}: " + ", ".join(f"{n} {s}" for s, n in sorted(states.items())))
    table(rows, f"machines of {name}")


@grouped(name=app_named, broker=broker)
def logs(
    machine_id: str | None = typer.Argument(None, help="One machine (default: every machine)."),
    stderr: bool = typer.Option(False, "--stderr", help="stderr instead of stdout."),
    lines: int = typer.Option(50, "--lines", "-n", help="Last lines per machine (0: all)."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming."),
    *,
    name: str,
    broker: Broker,
) -> None:
    """Output of one machine, or of all of the app's machines (each line prefixed)."""
    stream = "stderr" if stderr else "stdout"

    async def go() -> None:
        async with broker.client() as client:
            if machine_id:
                ids = [(machine_id, "")]
            else:
                ids = [(m.id, f"{m.region} {m.id} | ") for m in await views(client, name)]
            if follow:
                await asyncio.gather(
                    *(_follow(client, name, mid, prefix, stream) for mid, prefix in ids)
                )
                return
            texts = await asyncio.gather(*(client.logs(name, mid, stream) for mid, _ in ids))
            for (_mid, prefix), text in zip(ids, texts, strict=True):
                tail = text.splitlines()[-lines:] if lines else text.splitlines()
                for line in tail:
                    sys.stdout.write(f"{prefix}{line}\n")
            sys.stdout.flush()

    run(go())


async def _follow(client: MachinesClient, app: str, mid: str, prefix: str, stream: str) -> None:
    pending = b""
    async for chunk in client.stream_logs(app, mid, stream):
        pending += chunk
        *done, pending = pending.split(b"\n")
        for line in done:
            sys.stdout.write(f"{prefix}{line.decode(errors='replace')}\n")
        sys.stdout.flush()


def register(app: typer.Typer) -> None:
    """Add the deploy commands to the `souk` program."""
    app.command("deploy")(deploy_command)
    app.command("releases")(releases_command)
    app.command("rollback")(rollback)
    app.command("status")(status)
    app.command("logs")(logs)
    app.add_typer(scale, name="scale")
