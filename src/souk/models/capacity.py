"""A worker's capacity: what it has, what is reserved, what is free."""

from __future__ import annotations

from pydantic import BaseModel, Field

from souk.models.base import Strict
from souk.models.machine import CpuKind, GuestConfig


class Resources(BaseModel):
    cpus: int
    memory_mb: int


class Capacity(BaseModel):
    worker: str
    region: str
    cpu_kinds: list[CpuKind]
    total: Resources
    reserved: Resources
    free: Resources
    machines: int
    labels: dict[str, str] = Field(default_factory=dict)
    cordoned: bool = False
    draining: bool = False
    # Disk for volumes: what --disk-mb offers, what volumes reserve of it, what is left.
    disk_mb_total: int = 0
    disk_mb_reserved: int = 0
    disk_mb_free: int = 0
    volumes_refused: str | None = None  # why this worker makes no volumes; None: it does
    vm: str | None = None  # the vm driver's accelerator (kvm, tcg, none); None: no vm driver


class OfferRequest(Strict):
    """A broker asking a worker: would this guest fit here now?"""

    guest: GuestConfig
    image: str | None = None


class Offer(BaseModel):
    fits: bool
    image_cached: bool
    capacity: Capacity


class OfferCall(Strict):
    """Offers asked of many workers of a region with one message on the bus (scatter-gather):
    each worker named in `workers` answers with an `Offer` to the message's reply subject."""

    request: OfferRequest
    workers: list[str]


def offers_subject(region: str) -> str:
    return f"souk.offers.{region}"
