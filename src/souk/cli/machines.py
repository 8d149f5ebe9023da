"""`souk machines` and `souk apps`: the Machines API from a terminal (Rich tables, or --json)."""

from __future__ import annotations

import json
import sys
from typing import Any

import typer

from souk.cli.client import call, show

machines = typer.Typer(help="Run and manage machines.", no_args_is_help=True)
apps = typer.Typer(help="Create, list and delete apps.", no_args_is_help=True)

API = typer.Option(None, "--api", help="Broker URL (default: $SOUK_API, or souk dev's).")
TOKEN = typer.Option(None, "--token", help="Bearer token (default: $SOUK_TOKEN, or souk dev's).")
JSON = typer.Option(False, "--json", help="Print JSON instead of a table.")
APP = typer.Option("demo", "--app", "-a", help="The app.")
COLUMNS = ["id", "name", "state", "region", "worker", "cpus", "memory_mb", "command"]


def _flat(m: dict[str, Any]) -> dict[str, Any]:
    config = m.get("config", {})
    guest = config.get("guest", {})
    argv = (config.get("init") or {}).get("exec") or []
    return {
        **m,
        "cpus": guest.get("cpus"),
        "memory_mb": guest.get("memory_mb"),
        "command": " ".join(argv),
    }


def _one(m: dict[str, Any], as_json: bool) -> None:
    if as_json:
        print(json.dumps(m, indent=2))
    else:
        show([_flat(m)], COLUMNS, False)


@machines.command("run")
def run(
    command: list[str] = typer.Argument(..., help="The command, after --."),
    region: str = typer.Option(..., "--region", "-r", help="The one region to place it in."),
    app: str = APP,
    name: str | None = typer.Option(None, help="A name for the machine."),
    cpus: int = typer.Option(1, help="CPUs."),
    memory_mb: int = typer.Option(256, help="Memory in MB."),
    env: list[str] = typer.Option([], "--env", "-e", help="KEY=VALUE (repeatable)."),
    strategy: str = typer.Option("auto", help="auto, offers, p2c or catalog."),
    api: str | None = API,
    token: str | None = TOKEN,
    as_json: bool = JSON,
) -> None:
    """Place and start a machine running COMMAND: `souk machines run -r mad -- sleep 60`."""
    body: dict[str, Any] = {
        "region": region,
        "config": {
            "init": {"exec": command},
            "guest": {"cpus": cpus, "memory_mb": memory_mb},
            "env": dict(e.split("=", 1) for e in env if "=" in e),
        },
    }
    if name:
        body["name"] = name
    path = f"/v1/apps/{app}/machines"
    _one(call("POST", path, api, token, body, {"strategy": strategy}), as_json)


@machines.command("list")
def list_(
    app: str = APP,
    region: str | None = typer.Option(None, help="Only this region."),
    state: str | None = typer.Option(None, help="Only these states, comma-separated."),
    all_: bool = typer.Option(False, "--all", help="Include destroyed machines."),
    api: str | None = API,
    token: str | None = TOKEN,
    as_json: bool = JSON,
) -> None:
    """List an app's machines."""
    params = {k: v for k, v in {"region": region, "state": state}.items() if v}
    if all_:
        params["include_deleted"] = "true"
    rows = call("GET", f"/v1/apps/{app}/machines", api, token, params=params)
    show([_flat(m) for m in rows], COLUMNS, as_json, title=f"machines of {app}")


@machines.command("status")
def status(
    machine_id: str,
    app: str = APP,
    api: str | None = API,
    token: str | None = TOKEN,
    as_json: bool = JSON,
) -> None:
    """One machine."""
    _one(call("GET", f"/v1/apps/{app}/machines/{machine_id}", api, token), as_json)


def _action(
    verb: str,
    machine_id: str,
    app: str,
    api: str | None,
    token: str | None,
    as_json: bool,
    method: str = "POST",
    params: dict[str, str] | None = None,
) -> None:
    path = f"/v1/apps/{app}/machines/{machine_id}" + (f"/{verb}" if verb else "")
    _one(call(method, path, api, token, {} if method == "POST" else None, params), as_json)


@machines.command("start")
def start(
    machine_id: str,
    app: str = APP,
    api: str | None = API,
    token: str | None = TOKEN,
    as_json: bool = JSON,
) -> None:
    """Start a stopped machine."""
    _action("start", machine_id, app, api, token, as_json)


@machines.command("stop")
def stop(
    machine_id: str,
    app: str = APP,
    api: str | None = API,
    token: str | None = TOKEN,
    as_json: bool = JSON,
) -> None:
    """Stop a machine (its stop signal, then SIGKILL after its timeout)."""
    _action("stop", machine_id, app, api, token, as_json)


@machines.command("destroy")
def destroy(
    machine_id: str,
    app: str = APP,
    force: bool = typer.Option(False, help="Even if it is running."),
    api: str | None = API,
    token: str | None = TOKEN,
    as_json: bool = JSON,
) -> None:
    """Destroy a machine and release its reservation."""
    params = {"force": "true"} if force else None
    _action("", machine_id, app, api, token, as_json, "DELETE", params)


@machines.command("logs")
def logs(
    machine_id: str,
    app: str = APP,
    stderr: bool = typer.Option(False, help="stderr instead of stdout."),
    follow: bool = typer.Option(False, "--follow", "-f", help="Keep streaming."),
    api: str | None = API,
    token: str | None = TOKEN,
) -> None:
    """A machine's output."""
    params = {"stream": "stderr" if stderr else "stdout"}
    if follow:
        params["follow"] = "true"
    data = call(
        "GET", f"/v1/apps/{app}/machines/{machine_id}/logs", api, token, params=params, raw=True
    )
    sys.stdout.buffer.write(data)


@apps.command("create")
def create_app(
    name: str,
    org: str = typer.Option("personal", help="Organisation slug."),
    api: str | None = API,
    token: str | None = TOKEN,
    as_json: bool = JSON,
) -> None:
    """Create an app."""
    app = call("POST", "/v1/apps", api, token, {"name": name, "org_slug": org})
    show([app], ["name", "machine_count", "created_at"], as_json)


@apps.command("list")
def list_apps(api: str | None = API, token: str | None = TOKEN, as_json: bool = JSON) -> None:
    """Apps this token can see."""
    data = call("GET", "/v1/apps", api, token)
    show(data["apps"], ["name", "machine_count", "created_at"], as_json, title="apps")


@apps.command("destroy")
def destroy_app(
    name: str, api: str | None = API, token: str | None = TOKEN, as_json: bool = JSON
) -> None:
    """Delete an app that has no machines left."""
    call("DELETE", f"/v1/apps/{name}", api, token)
    if as_json:
        print(json.dumps({"deleted": name}))
    else:
        print(f"deleted app {name}")
