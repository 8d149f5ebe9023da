"""`souk broker` and `souk dev`."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from souk.broker import runtime
from souk.cli import serving
from souk.cli.options import grouped
from souk.cli.serving import log_to_stderr
from souk.cli.tls import TLS_CERT, TLS_DIR_HELP, TLS_KEY, part_tls, server_cert
from souk.web.listener import Limits


@grouped(part=serving.part_options)
def run(
    listen: str = typer.Option("127.0.0.1:4280", help="HOST:PORT of the Machines API."),
    secret_file: Path = typer.Option(
        ..., help="The cluster secret tokens are signed with.", resolve_path=True
    ),
    nats: str | None = typer.Option(
        None, help="NATS server URL(s), comma-separated: place from a catalog replica."
    ),
    catalog_dir: Path | None = typer.Option(
        None,
        help="Keep the catalog replica's SQLite copy here (default: in memory).",
        resolve_path=True,
    ),
    worker: list[str] = typer.Option(
        [], help="Without --nats: a worker's API URL, polled (repeat for each)."
    ),
    app_registry: Path | None = typer.Option(
        None,
        help="Host the cluster's app registry, stored in this directory (one broker).",
        resolve_path=True,
    ),
    app_registry_url: str | None = typer.Option(
        None, help="Forward app creates and deletes to the broker hosting the registry."
    ),
    deadline: float = typer.Option(2.0, help="Seconds a placement may take before 412."),
    policy: str = typer.Option("default", help="Placement policy: default, binpack, spread."),
    default_region: str | None = typer.Option(
        None,
        help="Where a create that names no region goes (default: the best offer of every"
        " region, as the market ranks them).",
    ),
    tls_dir: Path | None = typer.Option(
        None,
        help=f"{TLS_DIR_HELP} Reach workers over mutual TLS, and only so; reach the bus with "
        "them, apply only catalog rows their owners signed, sign the app registry's.",
        resolve_path=True,
    ),
    tls_name: str | None = typer.Option(
        None, help="This broker's name in --tls-dir (default: the one key there)."
    ),
    tls_cert: Path | None = TLS_CERT,
    tls_key: Path | None = TLS_KEY,
    insecure: bool = typer.Option(
        False, help="Without --tls-dir: follow an open bus other than loopback, unsigned rows."
    ),
    reserve_over_bus: bool = typer.Option(
        False,
        help="With --nats: send reservations to each worker's subject on the bus, over HTTP "
        "only when it does not answer there.",
    ),
    *,
    part: serving.Part,
) -> None:
    """Serve the public Machines API and place machines on workers."""
    log_to_stderr(part.logs.level, part.logs.format, "broker", "broker")
    host, port = serving.parse_listen(listen)
    tls = part_tls("broker", tls_dir, tls_name, insecure, nats)
    listener = server_cert(tls_cert, tls_key)
    secret = serving.secret_option(secret_file)
    if not nats and not worker:
        raise typer.BadParameter("give --nats (a catalog) or at least one --worker")
    opts = runtime.BrokerSettings(
        host=host,
        port=port,
        secret=secret,
        workers=worker,
        registry_dir=app_registry,
        registry_url=app_registry_url,
        deadline=deadline,
        policy=policy,
        nats=nats,
        catalog_dir=catalog_dir,
        tls=tls,
        listener=listener,
        default_region=default_region,
        reserve_over_bus=reserve_over_bus,
        metrics=part.metrics,
        limits=part.limits,
    )
    with serving.refusals("broker"):
        runtime.run(runtime.serve(opts))


DEV_DISK_MB = 1024  # a sparse file per volume: only what a volume holds takes room


@grouped(limits=serving.listener)
def dev(
    data_dir: Path = typer.Option(
        Path(".souk-dev"), help="Where every worker keeps its data.", resolve_path=True
    ),
    listen: str = typer.Option("127.0.0.1:4280", help="HOST:PORT of the broker."),
    proxy: str = typer.Option("127.0.0.1:4300", help="HOST:PORT of the proxy."),
    driver: str = typer.Option("process", help="process, or sim (runs nothing)."),
    secure: bool = typer.Option(
        False, help="A CA and certificates in the data dir: mutual TLS to workers, HTTPS."
    ),
    insecure_registry: list[str] = typer.Option(
        [], help="HOST[:PORT] of a registry every worker reaches over plain http; repeatable."
    ),
    disk_mb: int | None = typer.Option(
        None,
        min=0,
        help=f"Disk each worker offers to volumes, in MB (default: {DEV_DISK_MB} as root where"
        " loop devices work, else none; 0: none).",
    ),
    image_registry_port: int = typer.Option(
        4310,
        min=0,
        help="Port of its image registry on loopback (Debian's docker-registry): workers pull"
        " from it, a Dockerfile's build is pushed to it (0: none).",
    ),
    *,
    limits: Limits,
) -> None:
    """A whole cluster in one process: 3 regions x 2 workers, a broker and a proxy, on loopback."""
    from souk.dev import run_dev
    from souk.worker.volumes import disk as volume_disk

    log_to_stderr("warning")
    host, port = serving.parse_listen(listen)
    _, proxy_port = serving.parse_listen(proxy)
    serving.check_homes_reachable("dev", data_dir, driver)
    registries = tuple(insecure_registry)
    if disk_mb is None and driver != "sim" and volume_disk.unsupported_reason() is None:
        disk_mb = DEV_DISK_MB  # volumes can be tried at once, as the quick start does
    with serving.refusals("dev"):
        asyncio.run(
            run_dev(
                data_dir,
                host,
                port,
                proxy_port,
                driver,
                secure,
                registries,
                disk_mb=disk_mb or None,
                limits=limits,
                image_registry_port=image_registry_port or None,
            )
        )
