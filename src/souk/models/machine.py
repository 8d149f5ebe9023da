"""Machine shapes, named as in the Fly Machines API so that configs pass through unchanged."""

from __future__ import annotations

import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_core import PydanticCustomError

from souk.models.duration import Duration

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
CpuKind = Literal["shared", "performance"]
RestartPolicy = Literal["no", "always", "on-failure"]

APP_NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,62}\Z")
ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z")
MACHINE_ID = re.compile(r"^[0-9a-z]{6,32}\Z")
MAX_METADATA_BYTES = 64 << 10  # a machine's metadata, keys and values: it travels in every row
SIGNALS = {
    "SIGABRT",
    "SIGALRM",
    "SIGFPE",
    "SIGHUP",
    "SIGILL",
    "SIGINT",
    "SIGKILL",
    "SIGPIPE",
    "SIGQUIT",
    "SIGSEGV",
    "SIGTERM",
    "SIGTRAP",
    "SIGUSR1",
    "SIGUSR2",
}


def normalize_signal(value: str) -> str:
    """A signal's name as the drivers send it: `SIGTERM`, `TERM` and `sigterm` all name SIGTERM.

    Numbers are refused rather than mapped: they differ between architectures (SIGUSR1 is 10 on
    x86 and arm64, 30 on others), and Fly's API takes names."""
    name = value.upper()
    name = name if name.startswith("SIG") else f"SIG{name}"
    if name not in SIGNALS:
        hint = "; use a name, not a number" if value.strip().isdecimal() else ""
        raise ValueError(
            f"unknown signal {value[:32]!r}{hint}: one of {', '.join(sorted(SIGNALS))}"
        )
    return name


class MetadataTooLarge(ValueError):
    """A machine's metadata over `MAX_METADATA_BYTES`; an API answers it with a 413."""

    reason = "metadata_too_large"


def metadata_size(metadata: Mapping[str, str | None]) -> int:
    """Bytes of keys and values (UTF-8), as `check_metadata_size` counts them."""
    return sum(len(k.encode()) + len((v or "").encode()) for k, v in metadata.items())


def check_metadata_size(metadata: Mapping[str, str | None]) -> None:
    """The one limit on a machine's metadata, wherever it is set: a create, an update, or a
    patch once merged with what the machine already has."""
    size = metadata_size(metadata)
    if size > MAX_METADATA_BYTES:
        raise MetadataTooLarge(
            f"a machine's metadata is at most {MAX_METADATA_BYTES >> 10} KiB of keys and values;"
            f" this is {size} bytes"
        )


def check_metadata_size_in_model(metadata: Mapping[str, str | None]) -> None:
    """`check_metadata_size` inside a model: an error type the web layer answers with a 413."""
    try:
        check_metadata_size(metadata)
    except MetadataTooLarge as exc:
        raise PydanticCustomError(MetadataTooLarge.reason, str(exc)) from None


class Strict(BaseModel):
    """Unknown fields are an error: a typo must not silently become a default."""

    model_config = ConfigDict(extra="forbid")


class GuestConfig(Strict):
    cpu_kind: CpuKind = "shared"
    cpus: int = Field(1, ge=1, le=256)
    memory_mb: int = Field(256, ge=16, le=1 << 22)


class InitConfig(Strict):
    exec: list[str] | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    tty: bool = False

    @field_validator("exec", "entrypoint", "cmd")
    @classmethod
    def _no_nul(cls, argv: list[str] | None) -> list[str] | None:
        if argv and any("\0" in arg for arg in argv):
            raise ValueError("an argument cannot contain a NUL character")
        return argv


class RestartConfig(Strict):
    policy: RestartPolicy = "on-failure"
    max_retries: int = Field(10, ge=0, le=1000)


class StopConfig(Strict):
    signal: str = "SIGINT"
    timeout: Duration = 5.0

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        return normalize_signal(value)


class ServicePort(Strict):
    port: int = Field(ge=1, le=65535)
    handlers: list[str] = []


class ServiceConcurrency(Strict):
    type: Literal["connections", "requests"] = "requests"
    soft_limit: int = Field(20, ge=1)
    hard_limit: int = Field(25, ge=1)


class Service(Strict):
    protocol: Literal["tcp", "udp"] = "tcp"
    internal_port: int = Field(ge=1, le=65535)
    ports: list[ServicePort] = []
    autostop: Literal["off", "stop", "suspend"] | bool = "off"
    autostart: bool = True
    min_machines_running: int = Field(0, ge=0)
    concurrency: ServiceConcurrency | None = None


class Check(Strict):
    type: Literal["tcp", "http"] = "tcp"
    port: int = Field(ge=1, le=65535)
    path: str | None = None
    interval: Duration = 15.0
    timeout: Duration = 2.0
    grace_period: Duration = 0.0


class MachineConfig(Strict):
    image: str | None = Field(None, max_length=512)
    init: InitConfig = InitConfig()
    env: dict[str, str] = {}
    guest: GuestConfig = GuestConfig()
    restart: RestartConfig = RestartConfig()
    stop_config: StopConfig = StopConfig()
    metadata: dict[str, str] = {}
    services: list[Service] = []
    checks: dict[str, Check] = {}
    standbys: list[str] = []
    auto_destroy: bool = False

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not ENV_NAME.match(name):
                raise ValueError(f"bad environment variable name {name!r}")
            if "\0" in env[name]:
                raise ValueError(f"environment variable {name} contains a NUL character")
        return env

    @field_validator("metadata")
    @classmethod
    def _metadata_size(cls, metadata: dict[str, str]) -> dict[str, str]:
        check_metadata_size_in_model(metadata)
        return metadata

    @model_validator(mode="after")
    def _runnable(self) -> MachineConfig:
        if not self.image and not self.init.exec:
            raise ValueError("a machine needs an image or init.exec (the command to run)")
        return self

    def argv(self) -> list[str]:
        """What the process driver runs: init.exec, else entrypoint + cmd."""
        if self.init.exec:
            return list(self.init.exec)
        return [*(self.init.entrypoint or []), *(self.init.cmd or [])]


class MachineEvent(BaseModel):
    id: int
    type: str
    status: str
    source: str = "worker"
    timestamp: int  # milliseconds since the epoch, as Fly reports it
    request: dict[str, Any] = {}


CheckState = Literal["passing", "warning", "critical"]


class CheckStatus(BaseModel):
    """The latest result of one of the machine's checks, as Fly reports them: `warning` until
    the first pass and during the grace period, `critical` on a failure, `output` saying why."""

    name: str
    status: CheckState
    output: str = ""
    updated_at: str


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
    events: list[MachineEvent] = []
    checks: list[CheckStatus] = []


class CreateMachine(Strict):
    """What the worker's POST /v1/machines takes."""

    app: str
    config: MachineConfig
    name: str | None = Field(None, max_length=63)
    id: str | None = Field(None, pattern=r"^[0-9a-z]{6,32}$")
    start: bool = True

    @field_validator("app")
    @classmethod
    def _app_name(cls, app: str) -> str:
        if not APP_NAME.match(app):
            raise ValueError("app names are lower-case letters, digits and '-', at most 63")
        return app


class UpdateMachine(Strict):
    config: MachineConfig
    start: bool | None = None


class MetadataChange(Strict):
    """Keys to set and keys to remove from a machine's config.metadata, in place."""

    set: dict[str, str] = {}
    delete: list[str] = []


class StopRequest(Strict):
    """A stop's overrides of the machine's stop_config; the signal follows the same rule."""

    signal: str | None = None
    timeout: Duration | None = None

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str | None) -> str | None:
        return None if value is None else normalize_signal(value)


class WaitResult(BaseModel):
    ok: bool
    state: MachineState
    instance_id: str
