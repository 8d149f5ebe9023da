"""Workers as placement sees them, built in one line for the placement unit tests."""

from __future__ import annotations

from souk.broker.placement.candidates import Candidate
from souk.models.catalog import WorkerRow
from souk.models.machine import GuestConfig

SMALL = GuestConfig(cpus=1, memory_mb=256)


def worker(
    name: str, cpus_free: int, mem_free: int, cached: bool = False, **kw: object
) -> Candidate:
    values: dict[str, object] = {
        "worker": name,
        "address": f"http://{name}",
        "cpu_kinds": ("shared",),
        "cpus_total": 8,
        "memory_mb_total": 8192,
        "cpus_free": cpus_free,
        "memory_mb_free": mem_free,
        "image_cached": cached,
    }
    values.update(kw)
    return Candidate(**values)  # type: ignore[arg-type]


def row(name: str, region: str = "mad", **kw: object) -> WorkerRow:
    """A catalog row of an empty 4-cpu, 4 GiB worker, changed by `kw`."""
    values: dict[str, object] = {
        "id": name,
        "region": region,
        "address": f"http://{name}",
        "cpu_kinds": ["shared"],
        "cpus_total": 4,
        "memory_mb_total": 4096,
        "cpus_reserved": 0,
        "memory_mb_reserved": 0,
        "epoch": "e",
    }
    values.update(kw)
    return WorkerRow.model_validate(values)
