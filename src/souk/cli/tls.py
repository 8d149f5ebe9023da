"""The TLS options of the long-running commands: a part's node files (its identity in the
cluster, for mutual TLS between parts) and a public listener's certificate. Both are checked at
start, so a part given the wrong files stops with the reason instead of failing handshakes."""

from __future__ import annotations

import ipaddress
from pathlib import Path
from urllib.parse import urlsplit

import typer

from souk.pki import NodeFiles, PkiError
from souk.web.tls import ServerCert

TLS_DIR_HELP = (
    "This part's node files, as `souk certs issue --out DIR` writes them: NAME.crt, NAME.key "
    "and the cluster's ca.crt."
)
TLS_CERT = typer.Option(
    None, "--tls-cert", help="Serve HTTPS with this certificate (PEM chain).", resolve_path=True
)
TLS_KEY = typer.Option(None, "--tls-key", help="The key of --tls-cert (PEM).", resolve_path=True)


def node_files(directory: Path, role: str, name: str | None = None) -> NodeFiles:
    """The node files in `directory` for a part of `role` named `name` (default: the one key
    there), once checked (`NodeFiles.check`), and named as asked."""
    try:
        files = NodeFiles.find(directory, name)
    except PkiError as exc:
        raise typer.BadParameter(f"{exc} with --tls-name", param_hint="--tls-dir") from exc
    try:
        ident = files.check(role)
    except PkiError as exc:
        raise typer.BadParameter(str(exc), param_hint="--tls-dir") from exc
    if name is not None and ident.name != name:
        raise typer.BadParameter(
            f"{files.cert} is the certificate of {role} {ident.name}, not of {role} {name}",
            param_hint="--tls-dir",
        )
    return files


def server_cert(cert: Path | None, key: Path | None) -> ServerCert | None:
    """A public listener's certificate, or None for plain HTTP."""
    if cert is None and key is None:
        return None
    if cert is None or key is None:
        raise typer.BadParameter("give both --tls-cert and --tls-key, or neither")
    found = ServerCert(cert, key)
    try:
        found.build()
    except (OSError, ValueError) as exc:  # ssl.SSLError is an OSError
        raise typer.BadParameter(f"cannot serve TLS with {cert} and {key}: {exc}") from exc
    return found


def loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def open_bus(nats: str | None, insecure: bool) -> None:
    """Without node files a part joins the bus anonymously and its rows go unsigned (or it
    applies unsigned ones): as the worker's plain HTTP, only on loopback unless `--insecure`."""
    if not nats or insecure:
        return
    for url in (u.strip() for u in nats.split(",") if u.strip()):
        host = urlsplit(url if "://" in url else f"nats://{url}").hostname or ""
        if not loopback(host):
            raise typer.BadParameter(
                f"{url} is not loopback: give --tls-dir (mutual TLS to the bus, signed catalog "
                "rows), or --insecure to use an open bus and unsigned rows",
                param_hint="--nats",
            )


def part_tls(
    role: str, tls_dir: Path | None, name: str | None, insecure: bool, nats: str | None
) -> NodeFiles | None:
    """A serving part's security, chosen once at start: its node files (mutual TLS, signed
    rows), or none, and then `--insecure` alone lets it use an open bus other than loopback."""
    tls = node_files(tls_dir, role, name) if tls_dir is not None else None
    if tls is not None and insecure:
        raise typer.BadParameter(f"--insecure is for a {role} without --tls-dir: drop one")
    if tls is None:
        open_bus(nats, insecure)
    return tls
