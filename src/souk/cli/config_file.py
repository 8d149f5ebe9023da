"""Configuration files for the long-running parts: `souk worker|broker|proxy --config FILE`.

A file holds the same settings as the flags, named as the flags are without their dashes
(`data-dir = "/var/lib/souk/worker"`, `cpu-kind = ["shared", "performance"]`); a flag given on
the command line wins over the file. A key no flag has is an error that names it, so a typo is
never a setting silently left at its default. Relative paths in a file are relative to the
file's own directory (a unit's working directory is `/`). `--print-config` shows the settings
in effect, in the file's own format.
"""

from __future__ import annotations

import tomllib
import types
import typing
from pathlib import Path
from typing import Any

import tomli_w
import typer

# Parameters that are about the file itself, never in it.
_OWN = ("config", "print_config")


def _load(ctx: typer.Context, param: typer.CallbackParam, value: Path | None) -> Path | None:
    if value is None:
        return None
    try:
        data = tomllib.loads(value.read_text())
    except OSError as exc:
        raise typer.BadParameter(f"cannot read {value}: {exc.strerror}") from None
    except tomllib.TOMLDecodeError as exc:
        raise typer.BadParameter(f"{value}: {exc}") from None
    hints = typing.get_type_hints(ctx.command.callback) if ctx.command.callback else {}
    known = {p.name for p in ctx.command.params if p.name and p.name not in _OWN}
    defaults: dict[str, Any] = {}
    for key, setting in data.items():
        name = key.replace("-", "_")
        if name not in known:
            raise typer.BadParameter(f"{value}: unknown key {key!r}")
        if _is_path(hints.get(name)) and isinstance(setting, str):
            setting = str((value.parent / setting).absolute())
        defaults[name] = setting
    ctx.default_map = {**(ctx.default_map or {}), **defaults}
    return value


def _is_path(hint: object) -> bool:
    if hint is Path:
        return True
    return isinstance(hint, types.UnionType) and Path in typing.get_args(hint)


CONFIG = typer.Option(
    None,
    "--config",
    is_eager=True,
    callback=_load,
    help="A TOML file of these settings (keys as the flags, without dashes); flags win.",
)
PRINT_CONFIG = typer.Option(
    False, "--print-config", help="Print the settings in effect as TOML, and exit."
)


def show_config(ctx: typer.Context) -> None:
    """The settings in effect, in the command's own order, as a file `--config` reads back:
    paths absolute, unset settings left out (TOML has no null)."""
    settings: dict[str, Any] = {}
    for param in ctx.command.params:
        name = param.name
        value = ctx.params.get(name) if name else None
        if name is None or name in _OWN or value is None:
            continue
        if isinstance(value, tuple | list):
            value = [_plain(v) for v in value]
        settings[name.replace("_", "-")] = _plain(value)
    typer.echo(tomli_w.dumps(settings), nl=False)


def _plain(value: Any) -> Any:
    return str(value.absolute()) if isinstance(value, Path) else value
