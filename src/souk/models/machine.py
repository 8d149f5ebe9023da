"""Machine shapes, named as in the Fly Machines API so that configs pass through unchanged: the
machine as a worker reports it and the requests that create and change one. Its config's parts
live in modules of their own (`machine_config`, `guest`, `services`, `config_rules`), and are
importable from here too."""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator

from souk.models.base import AppName, Strict
from souk.models.config_rules import (
    ENV_NAME,
    MAX_METADATA_BYTES,
    SIGNALS,
    MetadataTooLarge,
    check_metadata_size,
    check_metadata_size_in_model,
    normalize_signal,
    stop_timeout_bounded,
)
from souk.models.duration import Duration
from souk.models.guest import SIZES, CpuKind, GuestConfig
from souk.models.machine_config import (
    InitConfig,
    MachineConfig,
    MachineFile,
    MachineProcess,
    Mount,
    RestartConfig,
    StopConfig,
)
from souk.models.services import (
    Check,
    CheckState,
    CheckStatus,
    MachineMetrics,
    Service,
    named_checks,
)

__all__ = [
    "ENV_NAME",
    "MACHINE_ID",
    "MAX_METADATA_BYTES",
    "SIGNALS",
    "SIZES",
    "Check",
    "CheckState",
    "CheckStatus",
    "CpuKind",
    "CreateMachine",
    "GuestConfig",
    "InitConfig",
    "Machine",
    "MachineConfig",
    "MachineEvent",
    "MachineFile",
    "MachineMetrics",
    "MachineProcess",
    "MachineState",
    "MetadataChange",
    "MetadataTooLarge",
    "Mount",
    "RestartConfig",
    "Service",
    "StopConfig",
    "StopRequest",
    "UpdateMachine",
    "WaitResult",
    "check_metadata_size",
    "check_metadata_size_in_model",
    "named_checks",
    "normalize_signal",
]

MachineState = Literal[
    "created",
    "starting",
    "started",
    "stopping",
    "stopped",
    "destroying",
    "destroyed",
    "failed",
    "suspended",  # frozen in memory: its processes keep their state and its reservation
]

MACHINE_ID = re.compile(r"^[0-9a-z]{6,32}\Z")


class MachineEvent(BaseModel):
    """One event in Fly's shape: `type` is Fly's (`launch`, `start`, `stop`, `exit`, ...);
    `step` is the souk step that logged it (an addition)."""

    id: str
    type: str
    status: str
    source: str = "worker"
    timestamp: int  # milliseconds since the epoch, as Fly reports it
    request: dict[str, Any] = Field(default_factory=dict)
    step: str | None = None


class Machine(BaseModel):
    id: str
    name: str
    app: str
    region: str
    state: MachineState
    instance_id: str
    config: MachineConfig
    worker: str
    private_ip: str | None = None
    restart_count: int = 0
    exit_code: int | None = None
    created_at: str
    updated_at: str
    events: list[MachineEvent] = Field(default_factory=list)
    checks: list[CheckStatus] = Field(default_factory=list)
    # The image its current version runs, by digest, once that version has started (the
    # broker shows it as Fly does, in `image_ref.digest`).
    image_digest: str | None = None


class CreateMachine(Strict):
    """What the worker's POST /v1/machines takes."""

    app: AppName
    config: MachineConfig
    name: str | None = Field(None, max_length=63)
    id: str | None = Field(None, pattern=r"^[0-9a-z]{6,32}$")
    start: bool = True
    # The app's private network, as `<org>/<name>` (docs/network.md); None: the worker's default.
    network: str | None = Field(None, max_length=128)
    # The app's secrets, opened by the broker: the machine's env at each start, and the content
    # of files that name one. Kept apart from the config, which GET shows and rows carry.
    secrets: dict[str, str] = Field(default_factory=dict, repr=False)
    # Fields of a Fly client's config the broker ignored (as Fly does), named in the create event.
    ignored_fields: list[str] | None = Field(None, max_length=256)


class UpdateMachine(Strict):
    config: MachineConfig
    start: bool | None = None
    secrets: dict[str, str] = Field(default_factory=dict, repr=False)  # as CreateMachine's


class MetadataChange(Strict):
    """Keys to set and keys to remove from a machine's config.metadata, in place."""

    set: dict[str, str] = Field(default_factory=dict)
    delete: list[str] = Field(default_factory=list)


class StopRequest(Strict):
    """A stop's overrides of the machine's stop_config; the signal follows the same rule."""

    signal: str | None = None
    timeout: Duration | None = None

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str | None) -> str | None:
        return None if value is None else normalize_signal(value)

    @field_validator("timeout")
    @classmethod
    def _bounded(cls, seconds: float | None, info: ValidationInfo) -> float | None:
        stop_timeout_bounded(seconds, info)
        return seconds


class WaitResult(BaseModel):
    ok: bool
    state: MachineState
    instance_id: str
