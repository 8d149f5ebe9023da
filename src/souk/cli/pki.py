"""`souk ca` and `souk certs`: the cluster CA and the certificates of its parts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import typer
from cryptography import x509

from souk.pki import ROLES, PkiError, identity_of, init_ca, issue_files, load_cert, verify_issued_by
from souk.pki.files import CA_CERT, CA_KEY
from souk.pki.issue import CA_DAYS, NODE_DAYS
from souk.pki.public import PUBLIC_DAYS, init_public_ca, issue_public

ca = typer.Typer(help="The cluster's certificate authority.", no_args_is_help=True)
certs = typer.Typer(help="Certificates of the cluster's parts and operators.", no_args_is_help=True)


def _summary(cert: x509.Certificate) -> dict[str, Any]:
    ident = identity_of(cert)
    san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    return {
        "role": ident.role,
        "name": ident.name,
        "uri": ident.uri,
        "dns": san.get_values_for_type(x509.DNSName),
        "ip": [str(ip) for ip in san.get_values_for_type(x509.IPAddress)],
        "not_before": cert.not_valid_before_utc.isoformat(),
        "not_after": ident.not_after.isoformat(),
        "serial": format(cert.serial_number, "x"),
    }


@ca.command("init")
def ca_init(
    directory: Path = typer.Option(
        ..., "--dir", help="Write ca.key and ca.crt here.", resolve_path=True
    ),
    common_name: str = typer.Option("souk cluster CA", "--name", help="The CA's common name."),
    days: int = typer.Option(CA_DAYS, min=1, help="Valid for this many days."),
    force: bool = typer.Option(False, help="Replace an existing CA (every issued cert dies)."),
) -> None:
    """Make the cluster's CA. Keep ca.key on the machine you issue from; give parts ca.crt."""
    try:
        cert = init_ca(directory, common_name, days, force)
    except PkiError as exc:
        raise typer.BadParameter(str(exc)) from exc
    print(
        f"wrote {directory / CA_KEY} (secret: it signs the cluster's certificates) and "
        f"{directory / CA_CERT}, valid until {cert.not_valid_after_utc:%Y-%m-%d}"
    )


@certs.command("issue")
def certs_issue(
    ca_dir: Path = typer.Option(
        ..., help="The CA's directory (ca.key, ca.crt).", resolve_path=True
    ),
    role: str = typer.Option(..., help=f"What the part is: {', '.join(ROLES)}."),
    name: str = typer.Option(..., help="Its name, unique in the cluster (a worker: its id)."),
    san: list[str] = typer.Option([], help="Another DNS name or IP address (repeatable)."),
    days: int = typer.Option(NODE_DAYS, min=1, help="Valid for this many days."),
    out: Path = typer.Option(
        ..., help="Write NAME.key, NAME.crt and ca.crt here.", resolve_path=True
    ),
    force: bool = typer.Option(False, help="Replace an existing key with a new one."),
    reuse_key: bool = typer.Option(False, help="Renew the certificate of the key in --out."),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object."),
) -> None:
    """Issue a certificate (and, unless --reuse-key, a new Ed25519 key) for one part."""
    if force and reuse_key:
        raise typer.BadParameter("--force makes a new key, --reuse-key keeps it: pick one")
    try:
        files, cert = issue_files(ca_dir, out, role, name, san, days, force, reuse_key)
    except PkiError as exc:
        raise typer.BadParameter(str(exc)) from exc
    paths = {"cert": str(files.cert), "key": str(files.key), "ca": str(files.ca)}
    summary = {**_summary(cert), **paths}
    if as_json:
        print(json.dumps(summary))
    else:
        print(f"wrote {files.key}, {files.cert} and {files.ca}")
        print(f"{summary['uri']}, valid until {cert.not_valid_after_utc:%Y-%m-%d %H:%M} UTC")


@certs.command("show")
def certs_show(
    cert_file: Path = typer.Argument(..., help="A certificate (PEM).", resolve_path=True),
    ca_cert: Path | None = typer.Option(
        None, "--ca", help="Also check it was issued by this CA.", resolve_path=True
    ),
    as_json: bool = typer.Option(False, "--json", help="Print a JSON object."),
) -> None:
    """Print whom a certificate speaks for; exit 1 if it is not a valid souk identity."""
    try:
        cert = load_cert(cert_file)
        summary = _summary(cert)
        if ca_cert is not None:
            verify_issued_by(cert, load_cert(ca_cert))
    except PkiError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    if as_json:
        print(json.dumps(summary))
    else:
        for key, value in summary.items():
            print(f"{key:<11} {', '.join(value) if isinstance(value, list) else value}")


@certs.command("public")
def certs_public(
    ca_dir: Path = typer.Option(
        ...,
        help="The public CA's directory: made on first use, kept (clients trust its ca.crt).",
        resolve_path=True,
    ),
    name: str = typer.Option(..., help="The name it serves: a DNS name or an address."),
    san: list[str] = typer.Option([], help="Another DNS name or address (repeatable)."),
    days: int = typer.Option(PUBLIC_DAYS, min=1, help="Valid for this many days."),
    out: Path = typer.Option(..., help="Write NAME.crt and NAME.key here.", resolve_path=True),
) -> None:
    """Issue an ECDSA certificate for a public listener (a broker's or a proxy's --tls-cert),
    which browsers take: they refuse the cluster's Ed25519 ones at the handshake."""
    try:
        trust = init_public_ca(ca_dir)
        cert, key = issue_public(ca_dir, out, name, san, days)
    except PkiError as exc:
        raise typer.BadParameter(str(exc)) from exc
    typer.echo(
        f"wrote {cert} (ECDSA P-256, the public CA after it) and {key}: serve them with"
        f" --tls-cert/--tls-key; clients trust {trust}"
    )
