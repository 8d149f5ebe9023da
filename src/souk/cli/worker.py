"""`souk worker`: run one worker daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from souk.cli.config_file import CONFIG, PRINT_CONFIG, show_config
from souk.cli.serving import (
    HEAD_TIMEOUT,
    KEEPALIVE_TIMEOUT,
    LOG_FORMAT,
    LOG_LEVEL,
    MAX_CONNECTIONS,
    MAX_PER_CLIENT,
    METRICS,
    check_homes_reachable,
    listener_limits,
    log_to_stderr,
    parse_listen,
    refusals,
)
from souk.cli.tls import TLS_DIR_HELP, loopback, part_tls
from souk.models.guest import CpuKind
from souk.models.wire import DEFAULT_PRIVATE_PREFIX, private_prefix_error
from souk.worker.daemon import serve
from souk.worker.settings import WorkerSettings
from souk.worker.storage import DataDirUnusable


def run(
    ctx: typer.Context,
    name: str = typer.Option(..., help="This worker's id, unique in the fleet."),
    region: str = typer.Option(..., help="The region it belongs to, e.g. mad."),
    listen: str = typer.Option("127.0.0.1:7100", help="HOST:PORT of its HTTP API."),
    data_dir: Path = typer.Option(
        ..., help="Where its database and machines' files live.", resolve_path=True
    ),
    cpus: int = typer.Option(..., min=1, help="CPUs it offers to machines."),
    memory_mb: int = typer.Option(..., min=16, help="Memory it offers to machines, in MB."),
    cpu_kind: list[str] = typer.Option(
        ["shared"], help="CPU kinds it offers: shared, performance (repeat for both)."
    ),
    disk_mb: int | None = typer.Option(
        None, help="Disk it offers to volumes, in MB (none without it; volumes need root)."
    ),
    label: list[str] = typer.Option([], help="KEY=VALUE labels reported with its capacity."),
    driver: str = typer.Option(
        "process", help="How machines run: process, vm (images as qemu guests), or sim."
    ),
    advertise: str | None = typer.Option(None, help="URL others reach it at (default: listen)."),
    insecure_registry: list[str] = typer.Option(
        [], help="HOST[:PORT] of a registry reached over plain http; repeatable."
    ),
    private_registry: list[str] = typer.Option(
        [],
        help="HOST[:PORT] of a registry on a private or loopback address, reached over https"
        " (other hosts only on public addresses); repeatable.",
    ),
    image_cache_mb: int | None = typer.Option(
        None, help="Budget of the image cache in MB (least recently used images go first)."
    ),
    no_fsync: bool = typer.Option(
        False, "--no-fsync", help="Skip fsync on commit (survives kill -9, not power loss)."
    ),
    nats: str | None = typer.Option(
        None, help="NATS server URL(s), comma-separated: publish this worker's catalog rows."
    ),
    tls_dir: Path | None = typer.Option(
        None,
        help=f"{TLS_DIR_HELP} NAME is --name. Serve mutual TLS only; reach the bus with them "
        "and sign this worker's catalog rows with its key.",
        resolve_path=True,
    ),
    insecure: bool = typer.Option(
        False,
        help="Without --tls-dir: serve plain HTTP on an address other than loopback, and "
        "publish unsigned rows to a bus other than loopback.",
    ),
    private_prefix: str = typer.Option(
        DEFAULT_PRIVATE_PREFIX, help="The cluster's /48 of private addresses (a ULA prefix)."
    ),
    mesh_port: int | None = typer.Option(
        None, help="Join the private network's WireGuard mesh on this UDP port (docs/network.md)."
    ),
    mesh_endpoint: str | None = typer.Option(
        None, help="HOST:PORT other hosts reach --mesh-port at."
    ),
    metrics: bool = METRICS,
    max_connections: int = MAX_CONNECTIONS,
    max_connections_per_client: int = MAX_PER_CLIENT,
    head_timeout: float = HEAD_TIMEOUT,
    keepalive_timeout: float = KEEPALIVE_TIMEOUT,
    log_level: str = LOG_LEVEL,
    log_format: str = LOG_FORMAT,
    config: Path | None = CONFIG,
    print_config: bool = PRINT_CONFIG,
) -> None:
    """Run a worker daemon: the source of truth for every machine on this host."""
    if print_config:
        show_config(ctx)
        return
    log_to_stderr(log_level, log_format, name, "worker")
    host, port = parse_listen(listen)
    check_homes_reachable("worker", data_dir, driver)
    tls = part_tls("worker", tls_dir, name, insecure, nats)
    if tls is not None and advertise is not None and not advertise.startswith("https://"):
        raise typer.BadParameter("with --tls-dir, an https:// URL", param_hint="--advertise")
    if tls is None and not insecure and not loopback(host):
        raise typer.BadParameter(
            f"{host} is not loopback: give --tls-dir (mutual TLS), or --insecure to serve "
            "plain HTTP to anyone who can reach it",
            param_hint="--listen",
        )
    kinds: list[CpuKind] = []
    for kind in cpu_kind:
        if kind not in ("shared", "performance"):
            raise typer.BadParameter(f"unknown cpu kind {kind!r}", param_hint="--cpu-kind")
        kinds.append(kind)  # type: ignore[arg-type]
    labels = dict(item.split("=", 1) for item in label if "=" in item)
    if (why := private_prefix_error(private_prefix)) is not None:
        raise typer.BadParameter(why, param_hint="--private-prefix")
    settings = WorkerSettings(
        name=name,
        region=region,
        data_dir=data_dir,
        cpus=cpus,
        memory_mb=memory_mb,
        cpu_kinds=tuple(kinds),
        disk_mb=disk_mb,
        labels=labels,
        address=advertise or f"{'https' if tls else 'http'}://{host}:{port}",
        durable=not no_fsync,
        insecure_registries=tuple(insecure_registry),
        private_registries=tuple(private_registry),
        image_cache_mb=image_cache_mb,
        metrics=metrics,
        private_prefix=private_prefix,
        mesh_port=mesh_port,
        mesh_endpoint=mesh_endpoint,
    )
    limits = listener_limits(
        max_connections, max_connections_per_client, head_timeout, keepalive_timeout
    )
    try:
        with refusals("worker"):
            asyncio.run(serve(settings, driver, host, port, nats, tls, limits))
    except DataDirUnusable as exc:  # one line, not a traceback: nothing to debug but the host
        typer.echo(f"souk worker: {exc}", err=True)
        raise typer.Exit(1) from None
