"""`souk worker`: run one worker daemon."""

from __future__ import annotations

import asyncio
from pathlib import Path

import typer

from souk.cli import serving
from souk.cli.options import grouped
from souk.cli.serving import log_to_stderr
from souk.cli.tls import TLS_DIR_HELP, loopback, part_tls
from souk.models.guest import CpuKind
from souk.models.wire import DEFAULT_PRIVATE_PREFIX
from souk.worker.daemon import serve
from souk.worker.settings import WorkerSettings
from souk.worker.state.storage import DataDirUnusable


@grouped(part=serving.part_options)
def run(
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
    private_prefix: serving.PrivatePrefix = DEFAULT_PRIVATE_PREFIX,
    mesh_port: serving.MeshPort = None,
    mesh_endpoint: serving.MeshEndpoint = None,
    *,
    part: serving.Part,
) -> None:
    """Run a worker daemon: the source of truth for every machine on this host."""
    log_to_stderr(part.logs.level, part.logs.format, name, "worker")
    host, port = serving.parse_listen(listen)
    serving.check_homes_reachable("worker", data_dir, driver)
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
        metrics=part.metrics,
        private_prefix=private_prefix,
        mesh_port=mesh_port,
        mesh_endpoint=mesh_endpoint,
    )
    try:
        with serving.refusals("worker"):
            asyncio.run(serve(settings, driver, host, port, nats, tls, part.limits))
    except DataDirUnusable as exc:  # one line, not a traceback: nothing to debug but the host
        typer.echo(f"souk worker: {exc}", err=True)
        raise typer.Exit(1) from None
