"""A worker's capacity: what it has, what is reserved, what is free."""

from __future__ import annotations

from pydantic import BaseModel

from souk.models.machine import CpuKind


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
    labels: dict[str, str] = {}
    cordoned: bool = False
    draining: bool = False
