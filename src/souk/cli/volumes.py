"""`souk volumes`: an app's volumes from a terminal (Rich tables, or --json)."""

from __future__ import annotations

import json
from typing import Any

import typer
from pydantic import BaseModel, ValidationError

from souk.cli.client import OnApp, on_app
from souk.cli.command import problems, show
from souk.cli.options import grouped
from souk.clients.machines import MachinesClient
from souk.models.volume import CreateVolumeRequest, ExtendVolumeRequest, Volume

volumes = typer.Typer(help="Create, grow, snapshot and destroy volumes.", no_args_is_help=True)

COLUMNS = ["id", "name", "state", "region", "zone", "size_mb", "attached_machine_id"]
SNAPSHOT_COLUMNS = ["id", "status", "size", "volume_size", "created_at"]


def _one(v: BaseModel, columns: list[str], as_json: bool) -> None:
    data: dict[str, Any] = v.model_dump(mode="json")
    if as_json:
        print(json.dumps(data, indent=2))
    else:
        show([data], columns, False)


def _size(size_gb: int | None, size_mb: int | None) -> dict[str, int]:
    return {k: v for k, v in (("size_gb", size_gb), ("size_mb", size_mb)) if v is not None}


@volumes.command("create")
@grouped(on=on_app)
def create(
    name: str = typer.Argument(..., help="The volume's name (a machine's mount names its id)."),
    region: str | None = typer.Option(None, "--region", "-r", help="The region to make it in."),
    size_gb: int | None = typer.Option(None, "--size-gb", "-s", help="Size in GB."),
    size_mb: int | None = typer.Option(None, "--size-mb", help="Size in MB (instead of GB)."),
    snapshot: str | None = typer.Option(None, "--snapshot", help="Restore this snapshot."),
    retention: int = typer.Option(5, help="Snapshots kept."),
    unique: bool = typer.Option(
        True, "--require-unique-zone/--no-require-unique-zone", help="Apart from its namesakes."
    ),
    *,
    on: OnApp,
) -> None:
    """Make a volume on a worker with the disk for it."""
    if size_gb is None and size_mb is None and snapshot is None:
        size_gb = 1
    try:
        req = CreateVolumeRequest(
            name=name,
            region=region,
            snapshot_id=snapshot,
            snapshot_retention=retention,
            require_unique_zone=unique,
            **_size(size_gb, size_mb),
        )
    except ValidationError as exc:
        raise typer.BadParameter(problems(exc)) from None
    _one(on.call(lambda c: c.create_volume(on.app, req)), COLUMNS, on.as_json)


@volumes.command("list")
@grouped(on=on_app)
def list_(*, on: OnApp) -> None:
    """List an app's volumes."""
    rows: list[Volume] = on.call(lambda c: c.volumes(on.app))
    show(
        [v.model_dump(mode="json") for v in rows], COLUMNS, on.as_json, title=f"volumes of {on.app}"
    )


@volumes.command("show")
@grouped(on=on_app)
def show_(
    volume_id: str,
    *,
    on: OnApp,
) -> None:
    """One volume, with its use of its file system."""
    columns = [*COLUMNS, "bytes_total", "bytes_used"]
    _one(on.call(lambda c: c.volume(on.app, volume_id)), columns, on.as_json)


@volumes.command("extend")
@grouped(on=on_app)
def extend(
    volume_id: str,
    size_gb: int | None = typer.Option(None, "--size-gb", "-s", help="New size in GB."),
    size_mb: int | None = typer.Option(None, "--size-mb", help="New size in MB."),
    *,
    on: OnApp,
) -> None:
    """Grow a volume (online: its machine keeps running)."""
    try:
        req = ExtendVolumeRequest(**_size(size_gb, size_mb))
    except ValidationError as exc:
        raise typer.BadParameter(problems(exc)) from None
    reply = on.call(lambda c: c.extend_volume(on.app, volume_id, req))
    if on.as_json:
        print(json.dumps(reply.model_dump(mode="json"), indent=2))
    else:
        _one(reply.volume, COLUMNS, False)


@volumes.command("snapshots")
@grouped(on=on_app)
def snapshots(
    volume_id: str,
    take: bool = typer.Option(False, "--take", help="Take one now, then list."),
    *,
    on: OnApp,
) -> None:
    """A volume's snapshots (oldest first); --take takes one first."""

    async def go(c: MachinesClient) -> list[dict[str, Any]]:
        if take:
            await c.snapshot_volume(on.app, volume_id)
        return [s.model_dump(mode="json") for s in await c.snapshots(on.app, volume_id)]

    show(on.call(go), SNAPSHOT_COLUMNS, on.as_json, title=f"snapshots of {volume_id}")


@volumes.command("destroy")
@grouped(on=on_app)
def destroy(
    volume_id: str,
    *,
    on: OnApp,
) -> None:
    """Destroy a volume and its snapshots (refused while a machine mounts it)."""
    _one(on.call(lambda c: c.destroy_volume(on.app, volume_id)), COLUMNS, on.as_json)
