"""Fly's machine config: what a machine runs, with which files, mounts, services and checks."""

from __future__ import annotations

import base64
import binascii
from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import AfterValidator, Field, ValidationInfo, field_validator, model_validator

from souk.models import limits
from souk.models.base import Strict
from souk.models.config_rules import (
    ENV_NAME,
    check_env,
    check_metadata_size_in_model,
    no_nul,
    normalize_signal,
    refused,
    stop_timeout_bounded,
    unsupported,
)
from souk.models.duration import Duration
from souk.models.guest import SIZES, GuestConfig
from souk.models.limits import at_most, bounded, counted, incoming
from souk.models.services import Check, MachineMetrics, Service
from souk.models.volume import VOLUME_ID

RestartPolicy = Literal["no", "always", "on-failure"]


def _env_checked(env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
    return check_env(counted(env, info, limits.MAX_ENV, "environment variables"))


# A machine's or a process's env: names a shell can set, at most `MAX_ENV` in a request.
Env = Annotated[dict[str, str], AfterValidator(_env_checked)]


class Command(Strict):
    """What a machine's init or one of its processes runs: the fields and rules both share."""

    exec: list[str] | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None

    @field_validator("exec", "entrypoint", "cmd")
    @classmethod
    def _no_nul(cls, argv: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if incoming(info):
            limits.argv_bounded(argv)
        return no_nul(argv)


class InitConfig(Command):
    tty: bool = False
    kernel_args: list[str] | None = None
    swap_size_mb: int | None = None

    _refused = refused(
        {
            "kernel_args": "souk's machines share the worker's kernel: no kernel arguments",
            "swap_size_mb": "souk's machines get no swap of their own; size memory_mb instead",
        }
    )


class RestartConfig(Strict):
    policy: RestartPolicy = "on-failure"
    max_retries: int = Field(10, ge=0, le=1000)
    gpu_bid_price: float | None = None

    _refused = refused(
        {
            "gpu_bid_price": "souk has no spot market for GPUs",
        }
    )


class StopConfig(Strict):
    signal: str = "SIGINT"
    timeout: Duration = 5.0

    @field_validator("signal")
    @classmethod
    def _known_signal(cls, value: str) -> str:
        return normalize_signal(value)

    @field_validator("timeout")
    @classmethod
    def _bounded(cls, seconds: float, info: ValidationInfo) -> float:
        stop_timeout_bounded(seconds, info)
        return seconds


EnvField = Literal["id", "version", "app_name", "private_ip", "region", "image"]


class EnvFrom(Strict):
    env_var: str
    field_ref: EnvField

    @field_validator("env_var")
    @classmethod
    def _name(cls, name: str) -> str:
        if not ENV_NAME.match(name):
            raise ValueError(f"bad environment variable name {name!r}")
        return name


EnvFroms = Annotated[list[EnvFrom], bounded(limits.MAX_ENV_FROM, "env_from entries")]


class MachineProcess(Command):
    """One of several processes run together in one machine, each its own command and env."""

    env: Env = Field(default_factory=dict)
    env_from: EnvFroms = Field(default_factory=list)
    user: str | None = Field(None, max_length=32)
    ignore_app_secrets: bool | None = None
    secrets: list[dict[str, Any]] | None = None
    # restarted in place by the machine's init (souk-init); None: by the machine's `restart`
    restart: RestartConfig | None = None

    @field_validator("user")
    @classmethod
    def _user(cls, user: str | None) -> str | None:
        if user and user != "root" and not (user.isdecimal() and int(user) < 65536):
            raise unsupported(
                "a process's user is 'root' or a number below 65536: ids of the app's own on"
                " the worker's host (user names need the image's /etc/passwd)"
            )
        return user

    _refused = refused(
        {
            "secrets": "per-process secrets are not supported yet",
        }
    )

    def argv(self, init: InitConfig) -> list[str]:
        """Its command: its exec, else its entrypoint + cmd, each part falling back to init's."""
        if self.exec:
            return list(self.exec)
        if self.entrypoint or self.cmd:
            return [*(self.entrypoint or init.entrypoint or []), *(self.cmd or init.cmd or [])]
        if init.exec:
            return list(init.exec)
        return [*(init.entrypoint or []), *(init.cmd or [])]

    def uid_offset(self) -> int:
        """Which of the app's host ids it runs as: 0 (the app's own) unless a number is given."""
        return int(self.user) if self.user and self.user.isdecimal() else 0


Processes = Annotated[list[MachineProcess], bounded(limits.MAX_PROCESSES, "processes")]


Schedule = Literal["hourly", "daily", "weekly", "monthly"]


class MachineFile(Strict):
    """A file written into the machine before each start (Fly's `files`): its content given
    base64-encoded in `raw_value`, or the name of an app secret holding it base64-encoded."""

    guest_path: str = Field(max_length=4096)
    raw_value: str | None = None
    secret_name: str | None = Field(None, max_length=128)
    image_config: str | None = None
    mode: int | None = Field(None, ge=0, le=0o7777)

    @field_validator("guest_path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        parts = path.split("/")
        if not path.startswith("/") or "\0" in path or any(p in (".", "..") for p in parts):
            raise ValueError("an absolute path without '.' or '..' components")
        if not any(parts):
            raise ValueError("a file's path, not the root")
        return path

    @field_validator("raw_value")
    @classmethod
    def _base64(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                base64.b64decode(value, validate=True)
            except (binascii.Error, ValueError):
                raise ValueError("raw_value: the file's content, base64-encoded") from None
        return value

    @model_validator(mode="after")
    def _one_source(self) -> MachineFile:
        if self.image_config is not None:
            raise ValueError("image_config: souk does not write an image's config as a file")
        if (self.raw_value is None) == (self.secret_name is None):
            raise ValueError("exactly one of raw_value or secret_name")
        return self

    def content(self, secrets: Mapping[str, str]) -> bytes:
        """The bytes to write, from the value or from the secret (base64 either way)."""
        encoded = self.raw_value if self.secret_name is None else secrets[self.secret_name]
        return base64.b64decode(encoded or "")

    def file_mode(self) -> int:
        """0644, or 0600 for a file from a secret, unless given."""
        if self.mode is not None:
            return self.mode
        return 0o600 if self.secret_name is not None else 0o644


class Mount(Strict):
    """A volume mounted into the machine (Fly's `MachineMount`; the sizing fields are for
    volumes Fly makes on the fly, which souk does not)."""

    volume: str = Field(pattern=VOLUME_ID.pattern)
    path: str = Field(max_length=255)
    name: str | None = None

    @field_validator("path")
    @classmethod
    def _absolute(cls, path: str) -> str:
        parts = path.split("/")
        if not path.startswith("/") or not path.strip("/") or ".." in parts or "\0" in path:
            raise ValueError("mount paths are absolute, not /, without '..'")
        return path.rstrip("/")


# What a request's config holds only so many of (`limits.py`); a stored one loads as it is.
Mounts = Annotated[list[Mount], bounded(limits.MAX_MOUNTS, "mounts")]  # one volume, as Fly has it
Services = Annotated[list[Service], bounded(limits.MAX_SERVICES, "services")]
Standbys = Annotated[list[str], bounded(limits.MAX_STANDBYS, "standbys")]


class MachineConfig(Strict):
    """Fly's machine config. Every field of Fly's spec is accepted by name; those souk cannot
    honour are refused with a 400 `unsupported` naming the field and why (docs/api.md)."""

    image: str | None = Field(None, max_length=512)
    init: InitConfig = Field(default_factory=InitConfig)
    env: Env = Field(default_factory=dict)
    guest: GuestConfig = Field(default_factory=GuestConfig)
    size: str | None = Field(None, description="A Fly size preset; sets guest's unset fields.")
    restart: RestartConfig = Field(default_factory=RestartConfig)
    stop_config: StopConfig = Field(default_factory=StopConfig)
    metadata: dict[str, str] = Field(default_factory=dict)
    services: Services = Field(default_factory=list)
    checks: dict[str, Check] = Field(default_factory=dict)
    standbys: Standbys = Field(default_factory=list)
    auto_destroy: bool = False
    processes: Processes = Field(default_factory=list)
    schedule: Schedule | None = None
    metrics: MachineMetrics | None = None
    disable_machine_autostart: bool | None = None
    mounts: Mounts = Field(default_factory=list)
    containers: list[dict[str, Any]] | None = None
    statics: list[dict[str, Any]] | None = None
    dns: dict[str, Any] | None = None
    rootfs: dict[str, Any] | None = None
    files: list[MachineFile] = Field(default_factory=list)

    @field_validator("files")
    @classmethod
    def _distinct_paths(cls, files: list[MachineFile], info: ValidationInfo) -> list[MachineFile]:
        if incoming(info):
            at_most(files, limits.MAX_FILES, "files")
            size = sum(len(f.raw_value or "") for f in files)
            if size > limits.MAX_FILES_BYTES:
                raise limits.exceeded(
                    f"files: at most {limits.MAX_FILES_BYTES} bytes of raw_value in all;"
                    f" this is {size}",
                    limits.MAX_FILES_BYTES,
                )
        paths = [f.guest_path.rstrip("/") for f in files]
        if len(set(paths)) != len(paths):
            raise ValueError("two files with the same guest_path")
        return files

    _refused = refused(
        {
            "containers": "souk runs one image per machine; use processes or machines",
            "statics": "souk's proxy does not serve static files",
        }
    )

    @field_validator("dns")
    @classmethod
    def _no_dns(cls, value: Any) -> Any:
        settings = {k: v for k, v in value.items() if k != "skip_registration"} if value else {}
        if any(v not in (None, False, "", []) for v in settings.values()):
            raise unsupported("souk's machines use the worker's resolver; no DNS settings")
        return value

    @field_validator("rootfs")
    @classmethod
    def _rootfs(cls, value: Any) -> Any:
        if value and (value.get("size_gb") or value.get("persist") not in (None, "never")):
            raise unsupported(
                "souk sizes no root filesystems and keeps none across restarts"
                " (its process driver has none; runc's is the image's, fresh per start)"
            )
        return value

    @field_validator("size")
    @classmethod
    def _known_size(cls, size: str | None) -> str | None:
        if size is not None and size not in SIZES:
            raise ValueError(f"unknown size {size!r}: one of {', '.join(SIZES)}")
        return size

    @model_validator(mode="before")
    @classmethod
    def _size_to_guest(cls, data: Any) -> Any:
        """A `size` preset fills the guest's fields the request did not set itself."""
        if not isinstance(data, dict) or data.get("size") not in SIZES:
            return data
        kind, cpus, memory = SIZES[data["size"]]
        given = data.get("guest")
        guest: dict[str, Any] = given if isinstance(given, dict) else {}
        preset = {"cpu_kind": kind, "cpus": cpus, "memory_mb": memory}
        return {**data, "guest": {**preset, **guest}}

    @field_validator("metadata")
    @classmethod
    def _metadata_size(cls, metadata: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if incoming(info):
            check_metadata_size_in_model(metadata)
        return metadata

    @model_validator(mode="after")
    def _runnable(self, info: ValidationInfo) -> MachineConfig:
        if incoming(info):
            count = len(self.checks) + sum(len(s.checks) for s in self.services)
            if count > limits.MAX_CHECKS:
                raise limits.exceeded(
                    f"checks: at most {limits.MAX_CHECKS} checks, the machine's and its"
                    f" services' together; this has {count}",
                    limits.MAX_CHECKS,
                )
        for name, check in self.checks.items():
            if check.port is None:
                raise ValueError(f"checks.{name}.port: a machine check needs a port")
        if self.processes and self.image and self._one_plain_process():
            self._one_process_as_command()
        if self.processes:
            # an image machine's process may take the image's command (which workers running
            # processes of images, the vm driver's, check)
            if not self.image and not all(p.argv(self.init) for p in self.processes):
                raise ValueError("processes: each process needs a command (exec or cmd)")
            if not self.image and any(p.restart for p in self.processes):
                raise unsupported("processes.restart: for image machines (their init runs it)")
        elif not self.image and not self.init.exec:
            raise ValueError("a machine needs an image or init.exec (the command to run)")
        return self

    def _one_plain_process(self) -> bool:
        """One process with no user or env_from of its own: any image driver runs it as the
        image's command. Several (or one with its own user) need a guest init (souk-init), which
        runc and vm machines have: workers that cannot run them refuse them at admission."""
        return len(self.processes) == 1 and not (
            self.processes[0].user or self.processes[0].env_from or self.processes[0].restart
        )

    def _one_process_as_command(self) -> None:
        """An image machine's one process is its command (Fly's clients send a command so):
        folded into `init` and `env`, so that what the config shows is what runs."""
        (process,) = self.processes
        command: dict[str, Any] = {
            k: getattr(process, k) for k in ("exec", "entrypoint", "cmd") if getattr(process, k)
        }
        if "exec" in command:
            command.update(entrypoint=None, cmd=None)
        self.init = self.init.model_copy(update=command)
        self.env = {**self.env, **process.env}
        self.processes = []

    def argv(self) -> list[str]:
        """What the process driver runs: init.exec, else entrypoint + cmd."""
        if self.init.exec:
            return list(self.init.exec)
        return [*(self.init.entrypoint or []), *(self.init.cmd or [])]
