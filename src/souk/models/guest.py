"""A machine's guest: the kind and number of cpus and the memory it reserves on a worker, and
Fly's size presets for them."""

from __future__ import annotations

from typing import Literal

from pydantic import Field

from souk.models.base import Strict
from souk.models.config_rules import refused

CpuKind = Literal["shared", "performance"]

# Fly's `size` presets: (cpu_kind, cpus, memory_mb), as Fly maps them to guests.
SIZES: dict[str, tuple[CpuKind, int, int]] = {
    **{f"shared-cpu-{n}x": ("shared", n, 256 * n) for n in (1, 2, 4, 8)},
    **{f"performance-{n}x": ("performance", n, 2048 * n) for n in (1, 2, 4, 8, 16)},
}


class GuestConfig(Strict):
    cpu_kind: CpuKind = "shared"
    cpus: int = Field(1, ge=1, le=256)
    memory_mb: int = Field(256, ge=16, le=1 << 22)
    gpus: int | None = None
    gpu_kind: str | None = None
    host_dedication_id: str | None = None
    kernel_args: list[str] | None = None
    persist_rootfs: Literal["never"] | None = None

    _refused = refused(
        {
            "gpus": "souk's workers offer no GPUs",
            "gpu_kind": "souk's workers offer no GPUs",
            "host_dedication_id": "souk has no dedicated hosts; the market picks the worker",
            "kernel_args": "souk's machines share the worker's kernel: no kernel arguments",
        }
    )
