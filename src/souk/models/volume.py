"""Volumes: a slice of one worker's disk, as the Machines API and the worker show it.

Shapes follow Fly's (`Volume`, `CreateVolumeRequest`, `ExtendVolumeRequest`, `VolumeSnapshot`).
Sizes: Fly counts whole GB (`size_gb`); souk also takes `size_mb` so a small volume (a test, a
queue's spool) needs no gigabyte of disk. Inside souk every size is MB.
"""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from souk.models.base import Strict

VolumeState = Literal["creating", "restoring", "created", "extending", "destroying", "destroyed"]
VOLUME_ID = re.compile(r"^vol_[0-9a-z]{6,32}$")
VOLUME_NAME = re.compile(r"^[a-z0-9_]{1,30}$")
MAX_SIZE_MB = 500 * 1024  # Fly's largest volume
DEFAULT_RETENTION = 5  # snapshots kept per volume unless asked otherwise
MAX_RETENTION = 60


def _size_mb(size_gb: int | None, size_mb: int | None) -> int | None:
    if size_gb is not None and size_mb is not None:
        raise ValueError("give size_gb or size_mb, not both")
    return size_mb if size_gb is None else size_gb * 1024


class CreateVolumeRequest(Strict):
    """The public API's body (Fly's fields; the ones souk has no use for are accepted and kept
    out of the way: `encrypted`, `compute`, `compute_image`, `auto_backup_enabled`)."""

    name: str
    size_gb: int | None = Field(None, ge=1, le=MAX_SIZE_MB // 1024)
    size_mb: int | None = Field(None, ge=8, le=MAX_SIZE_MB)
    region: str | None = None
    require_unique_zone: bool = True
    unique_zone_app_wide: bool = False
    snapshot_id: str | None = None
    snapshot_retention: int = Field(DEFAULT_RETENTION, ge=1, le=MAX_RETENTION)
    source_volume_id: str | None = None
    fstype: Literal["ext4"] = "ext4"
    encrypted: bool | None = None
    auto_backup_enabled: bool | None = None
    compute: dict[str, object] | None = None
    compute_image: str | None = None

    @field_validator("name")
    @classmethod
    def _name(cls, name: str) -> str:
        if not VOLUME_NAME.match(name):
            raise ValueError("volume names are lower-case letters, digits and '_', at most 30")
        return name

    @model_validator(mode="after")
    def _sized(self) -> CreateVolumeRequest:
        if self.source_volume_id is not None:
            raise ValueError("source_volume_id: forking a volume is not supported; snapshot it")
        if _size_mb(self.size_gb, self.size_mb) is None and self.snapshot_id is None:
            raise ValueError("size_gb (or size_mb) is required unless restoring a snapshot")
        return self

    def wanted_mb(self) -> int | None:
        return _size_mb(self.size_gb, self.size_mb)


class CreateVolume(Strict):
    """What the worker's POST /v1/volumes takes: the broker has chosen the worker and the id."""

    app: str
    id: str = Field(pattern=VOLUME_ID.pattern)
    name: str
    size_mb: int | None = Field(None, ge=8, le=MAX_SIZE_MB)
    snapshot_id: str | None = None
    snapshot_retention: int = Field(DEFAULT_RETENTION, ge=1, le=MAX_RETENTION)

    @model_validator(mode="after")
    def _sized(self) -> CreateVolume:
        if self.size_mb is None and self.snapshot_id is None:
            raise ValueError("size_mb is required unless restoring a snapshot")
        return self


class UpdateVolumeRequest(Strict):
    snapshot_retention: int | None = Field(None, ge=1, le=MAX_RETENTION)
    auto_backup_enabled: bool | None = None


class ExtendVolumeRequest(Strict):
    size_gb: int | None = Field(None, ge=1, le=MAX_SIZE_MB // 1024)
    size_mb: int | None = Field(None, ge=8, le=MAX_SIZE_MB)

    @model_validator(mode="after")
    def _sized(self) -> ExtendVolumeRequest:
        if _size_mb(self.size_gb, self.size_mb) is None:
            raise ValueError("size_gb (or size_mb) is required")
        return self

    def wanted_mb(self) -> int:
        return _size_mb(self.size_gb, self.size_mb) or 0


class Volume(BaseModel):
    id: str
    name: str
    app: str
    state: VolumeState
    region: str
    zone: str  # the worker that holds it: a volume never leaves its worker
    size_gb: int  # rounded up, as Fly reports it
    size_mb: int
    fstype: str = "ext4"
    encrypted: bool = False
    snapshot_retention: int = DEFAULT_RETENTION
    attached_machine_id: str | None = None
    attached_alloc_id: str | None = None
    block_size: int = 0
    blocks: int = 0
    blocks_free: int = 0
    blocks_avail: int = 0
    bytes_total: int = 0
    bytes_used: int = 0
    host_status: Literal["ok", "unknown", "unreachable"] = "ok"
    created_at: str


class ExtendVolumeResponse(BaseModel):
    volume: Volume
    needs_restart: bool = False  # resize2fs grows a mounted ext4 online


class VolumeSnapshot(BaseModel):
    id: str
    status: Literal["created"] = "created"
    size: int  # bytes the snapshot takes on disk
    volume_size: int  # bytes, the volume's size when it was taken
    digest: str = ""
    created_at: str
    retention_days: int | None = None


def size_gb_of(size_mb: int) -> int:
    return -(-size_mb // 1024)
