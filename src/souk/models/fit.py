"""Does a guest fit a worker, and if not, why: the one rule.

The worker applies it when it reserves (and its answer is final); the broker applies it to the
catalog's picture and to offers, only to guess which workers are worth asking. Both must name a
refusal the same way, so an operator reading "why not here" sees the same words from either.
Checks run cheapest and most decisive first: a cordoned worker refuses whatever fits.
"""

from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from typing import Literal

from souk.models.machine import CpuKind

MisfitKind = Literal["cordoned", "draining", "cpu_kind", "room", "volumes"]


@dataclass(frozen=True, slots=True)
class Misfit:
    """`kind` is for code (the worker answers 409 for a cordon, 412 for the rest); `reason` is
    the sentence shown to people, identical wherever the check runs."""

    kind: MisfitKind
    reason: str


def misfit(
    cpu_kind: CpuKind,
    cpus: int,
    memory_mb: int,
    *,
    kinds: Collection[CpuKind],
    cpus_free: int,
    memory_mb_free: int,
    cordoned: bool = False,
    draining: bool = False,
) -> Misfit | None:
    """None if `cpus` of `cpu_kind` and `memory_mb` fit in what is free, else why not.

    `cpus` and `memory_mb` are what is asked on top of what is reserved: a whole guest for a
    create, the growth for a resize.
    """
    if cordoned or draining:
        return _closed(cordoned)
    if cpu_kind not in kinds:
        return Misfit("cpu_kind", f"no {cpu_kind} cpus")
    if cpus > cpus_free or memory_mb > memory_mb_free:
        return Misfit("room", f"not enough room: free {cpus_free} cpus, {memory_mb_free} MB")
    return None


def _closed(cordoned: bool) -> Misfit:
    """A worker that takes nothing new, for guests and volumes alike: cordoned comes first."""
    kind: MisfitKind = "cordoned" if cordoned else "draining"
    return Misfit(kind, kind)


def disk_misfit(
    size_mb: int,
    *,
    disk_mb_free: int,
    volumes_refused: str | None = None,
    cordoned: bool = False,
    draining: bool = False,
) -> Misfit | None:
    """None if a volume of `size_mb` (or a growth by it) fits in the disk the worker offers."""
    if cordoned or draining:
        return _closed(cordoned)
    if volumes_refused is not None:
        return Misfit("volumes", f"makes no volumes: {volumes_refused}")
    if size_mb > disk_mb_free:
        return Misfit("room", f"not enough disk: free {disk_mb_free} MB")
    return None
