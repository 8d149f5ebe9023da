"""`souk mesh`: a node's WireGuard key on the private network's mesh (docs/network.md). Shaped
as `souk certs` is: the command writes the file, the running part picks it up by itself."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from souk.network.mesh import KEY_FILE, RELOAD_INTERVAL, public_of, rotate_key

app = typer.Typer(help="A node's key on the private network's mesh.", no_args_is_help=True)

KeyDir = Annotated[
    Path,
    typer.Option(
        "--dir",
        help=f"Where the node keeps {KEY_FILE}: a worker's --data-dir, a proxy's --mesh-dir.",
        resolve_path=True,
    ),
]
AsJson = Annotated[bool, typer.Option("--json", help="Print a JSON object.")]


def _key(directory: Path) -> Path:
    path = directory / KEY_FILE
    if not path.is_file():
        raise typer.BadParameter(
            f"no {KEY_FILE} in {directory}: a node makes its own at its first start on the mesh",
            param_hint="--dir",
        )
    return path


@app.command("show")
def show(directory: KeyDir, as_json: AsJson = False) -> None:
    """Print the node's public key, as its peers know it."""
    path = _key(directory)
    try:
        public = public_of(path.read_text())
    except ValueError as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--dir") from exc
    print(json.dumps({"key": str(path), "public_key": public}) if as_json else public)


@app.command("rotate")
def rotate(directory: KeyDir, as_json: AsJson = False) -> None:
    """Replace the node's key by a new one (0600). The running worker or proxy sets it within
    seconds and says its new public key in its catalog row (a proxy: its announcement); every
    peer takes the new key in place of the old, which then opens nothing."""
    path = _key(directory)
    try:
        old, new = rotate_key(path)
    except ValueError as exc:
        raise typer.BadParameter(f"{path}: {exc}", param_hint="--dir") from exc
    if as_json:
        print(json.dumps({"key": str(path), "old_public_key": old, "public_key": new}))
    else:
        print(f"wrote {path} (0600): public key {new}, was {old}")
        print(f"a running node takes it within {RELOAD_INTERVAL:g} seconds, its peers after it")
