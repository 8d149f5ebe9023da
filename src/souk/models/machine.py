"""Machine shapes, named as in the Fly Machines API so that configs pass through unchanged."""

from __future__ import annotations

import base64
import binascii
import re
from collections.abc import Mapping
from typing import Any, Literal

from pydantic import (
    BaseModel,
    Field,
    ValidationInfo,
    field_validator,
    model_validator,
)
from pydantic_core import PydanticCustomError

from souk.models import limits
from souk.models.base import AppName, Strict
from souk.models.duration import Duration
from souk.models.limits import at_most, in_range, incoming
from souk.models.volume import VOLUME_ID

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
    if len(metadata) > limits.MAX_METADATA_ENTRIES:
        raise MetadataTooLarge(
            f"a machine's metadata has at most {limits.MAX_METADATA_ENTRIES} keys;"
            f" this has {len(metadata)}"
        )
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


def unsupported(why: str) -> PydanticCustomError:
    """A field of Fly's config that souk cannot honour: refused (400 `unsupported`, naming the
    field) rather than ignored, since ignoring it would change what the user gets."""
    return PydanticCustomError("unsupported", why)


def refused(reasons: dict[str, str]) -> Any:
    """One validator for a model's fields souk cannot honour, each with why: `unsupported` unless
    sent empty (`refuse_set`)."""

    def check(cls: type, value: Any, info: ValidationInfo) -> Any:
        return refuse_set(value, reasons[str(info.field_name)])

    return field_validator(*reasons)(classmethod(check))  # type: ignore[arg-type]


def refuse_set(value: Any, why: str) -> Any:
    """`value` if it is empty (as Fly's clients send unset fields), else `unsupported`."""
    if value in (None, False, 0, "", [], {}):
        return value
    raise unsupported(why)


# Fly's `size` presets: (cpu_kind, cpus, memory_mb), as Fly maps them to guests.
SIZES: dict[str, tuple[CpuKind, int, int]] = {
    **{f"shared-cpu-{n}x": ("shared", n, 256 * n) for n in (1, 2, 4, 8)},
    **{f"performance-{n}x": ("performance", n, 2048 * n) for n in (1, 2, 4, 8, 16)},
}


def no_nul(argv: list[str] | None) -> list[str] | None:
    if argv and any("\0" in arg for arg in argv):
        raise ValueError("an argument cannot contain a NUL character")
    return argv


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


class InitConfig(Strict):
    exec: list[str] | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    tty: bool = False
    kernel_args: list[str] | None = None
    swap_size_mb: int | None = None

    @field_validator("exec", "entrypoint", "cmd")
    @classmethod
    def _no_nul(cls, argv: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if incoming(info):
            limits.argv_bounded(argv)
        return no_nul(argv)

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


def stop_timeout_bounded(seconds: float | None, info: ValidationInfo) -> None:
    """A stop waits at most `MAX_STOP_TIMEOUT` for the machine before killing it."""
    if seconds is not None and incoming(info):
        in_range(seconds, 0, limits.MAX_STOP_TIMEOUT, "timeout")


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


class ServicePort(Strict):
    port: int | None = Field(None, ge=1, le=65535)  # required: ranges are refused below
    handlers: list[str] = Field(default_factory=list)
    force_https: bool = False  # the proxy redirects plain HTTP on this port to https
    start_port: int | None = None
    end_port: int | None = None
    http_options: dict[str, Any] | None = None
    tls_options: dict[str, Any] | None = None
    proxy_proto_options: dict[str, Any] | None = None

    _refused = refused(
        {
            "start_port": "souk's proxy forwards single ports, not ranges",
            "end_port": "souk's proxy forwards single ports, not ranges",
            "http_options": "souk's proxy has no per-port HTTP, TLS or PROXY options yet",
            "tls_options": "souk's proxy has no per-port HTTP, TLS or PROXY options yet",
            "proxy_proto_options": "souk's proxy has no per-port HTTP, TLS or PROXY options yet",
        }
    )

    @model_validator(mode="after")
    def _one_port(self) -> ServicePort:
        if self.port is None:
            raise ValueError("port: a service's port needs a number")
        return self


class ServiceConcurrency(Strict):
    type: Literal["connections", "requests"] = "requests"
    soft_limit: int = Field(20, ge=1)
    hard_limit: int = Field(25, ge=1)


class HttpHeader(Strict):
    """One header of an http check, as Fly writes them: a name and its values."""

    name: str = Field(min_length=1, max_length=256, pattern=r"^[!#$%&'*+.^_`|~0-9A-Za-z-]+$")
    values: list[str] = Field(default_factory=list)

    @field_validator("values")
    @classmethod
    def _one_line(cls, values: list[str]) -> list[str]:
        if any("\r" in v or "\n" in v or "\0" in v for v in values):
            raise ValueError("a header value is one line")
        return values


class Check(Strict):
    """A health check; `port` may be left out in a service's checks (its internal port)."""

    type: Literal["tcp", "http"] = "tcp"
    port: int | None = Field(None, ge=1, le=65535)
    path: str | None = None
    interval: Duration = 15.0
    timeout: Duration = 2.0
    grace_period: Duration = 0.0
    method: str | None = Field(None, pattern=r"^[A-Za-z]{1,16}$")
    headers: list[HttpHeader] = Field(default_factory=list)
    protocol: Literal["http", "https"] | None = None
    tls_server_name: str | None = Field(None, max_length=253)
    tls_skip_verify: bool | None = None
    kind: Literal["informational", "readiness"] | None = None

    @model_validator(mode="after")
    def _bounded(self, info: ValidationInfo) -> Check:
        if incoming(info):
            in_range(
                self.interval, limits.MIN_CHECK_INTERVAL, limits.MAX_CHECK_INTERVAL, "interval"
            )
            in_range(self.timeout, 0, limits.MAX_CHECK_TIMEOUT, "timeout")
            in_range(self.grace_period, 0, limits.MAX_CHECK_GRACE, "grace_period")
            at_most(self.headers, limits.MAX_CHECK_HEADERS, "headers")
            sent = sum(len(h.name) + sum(len(v.encode()) for v in h.values) for h in self.headers)
            if sent > limits.MAX_CHECK_HEADER_BYTES:
                raise limits.exceeded(
                    f"headers: at most {limits.MAX_CHECK_HEADER_BYTES} bytes of names and"
                    f" values; this is {sent}",
                    limits.MAX_CHECK_HEADER_BYTES,
                )
            path = len((self.path or "").encode())
            if path > limits.MAX_CHECK_PATH:
                raise limits.exceeded(
                    f"path: at most {limits.MAX_CHECK_PATH} bytes; this is {path}",
                    limits.MAX_CHECK_PATH,
                )
        return self


class Service(Strict):
    protocol: Literal["tcp", "udp"] = "tcp"
    internal_port: int = Field(ge=1, le=65535)
    ports: list[ServicePort] = Field(default_factory=list)
    autostop: Literal["off", "stop", "suspend"] = "off"
    autostart: bool = True
    min_machines_running: int = Field(0, ge=0)
    concurrency: ServiceConcurrency | None = None
    checks: list[Check] = Field(default_factory=list)
    force_instance_key: str | None = None
    force_instance_description: str | None = None

    @field_validator("autostop", mode="before")
    @classmethod
    def _autostop(cls, value: Any) -> Any:
        """Fly's older clients send booleans; kept as the string the spec names."""
        if value is True:
            return "stop"
        return "off" if value is False else value

    _refused = refused(
        {
            "force_instance_key": "souk's proxy does not pin requests to one machine",
            "force_instance_description": "souk's proxy does not pin requests to one machine",
        }
    )

    @field_validator("ports")
    @classmethod
    def _few_ports(cls, ports: list[ServicePort], info: ValidationInfo) -> list[ServicePort]:
        if incoming(info):
            at_most(ports, limits.MAX_PORTS, "ports in a service")
        return ports


def service_check_name(index: int, check: Check, port: int) -> str:
    """A service check's name, as Fly shows them: servicecheck-<n>-<type>-<port>."""
    return f"servicecheck-{index:02d}-{check.type}-{port}"


def named_checks(checks: Mapping[str, Check], services: list[Service]) -> dict[str, Check]:
    """Every check the worker runs: the top-level ones and each service's, with its port."""
    out = dict(checks)
    n = 0
    for service in services:
        for check in service.checks:
            port = check.port or service.internal_port
            out[service_check_name(n, check, port)] = check.model_copy(update={"port": port})
            n += 1
    return out


class MachineMetrics(Strict):
    """Where the machine serves its own Prometheus metrics (Fly's `config.metrics`): scraped at
    its private address; the broker lists them at `/v1/prometheus/targets`."""

    port: int | None = Field(None, ge=1, le=65535)
    path: str | None = Field(None, pattern=r"^/[!-~]*$", max_length=1024)
    https: bool = False


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


class MachineProcess(Strict):
    """One of several processes run together in one machine, each its own command and env."""

    exec: list[str] | None = None
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: dict[str, str] = Field(default_factory=dict)
    env_from: list[EnvFrom] = Field(default_factory=list)
    user: str | None = Field(None, max_length=32)
    ignore_app_secrets: bool | None = None
    secrets: list[dict[str, Any]] | None = None
    # restarted in place by the machine's init (souk-init); None: by the machine's `restart`
    restart: RestartConfig | None = None

    @field_validator("exec", "entrypoint", "cmd")
    @classmethod
    def _no_nul(cls, argv: list[str] | None, info: ValidationInfo) -> list[str] | None:
        if incoming(info):
            limits.argv_bounded(argv)
        return no_nul(argv)

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if incoming(info):
            at_most(env, limits.MAX_ENV, "environment variables")
        return check_env(env)

    @field_validator("env_from")
    @classmethod
    def _few_env_from(cls, env_from: list[EnvFrom], info: ValidationInfo) -> list[EnvFrom]:
        if incoming(info):
            at_most(env_from, limits.MAX_ENV_FROM, "env_from entries")
        return env_from

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


Schedule = Literal["hourly", "daily", "weekly", "monthly"]


def check_env(env: dict[str, str]) -> dict[str, str]:
    for name in env:
        if not ENV_NAME.match(name):
            raise ValueError(f"bad environment variable name {name!r}")
        if "\0" in env[name]:
            raise ValueError(f"environment variable {name} contains a NUL character")
    return env


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


class MachineConfig(Strict):
    """Fly's machine config. Every field of Fly's spec is accepted by name; those souk cannot
    honour are refused with a 400 `unsupported` naming the field and why (docs/api.md)."""

    image: str | None = Field(None, max_length=512)
    init: InitConfig = Field(default_factory=InitConfig)
    env: dict[str, str] = Field(default_factory=dict)
    guest: GuestConfig = Field(default_factory=GuestConfig)
    size: str | None = Field(None, description="A Fly size preset; sets guest's unset fields.")
    restart: RestartConfig = Field(default_factory=RestartConfig)
    stop_config: StopConfig = Field(default_factory=StopConfig)
    metadata: dict[str, str] = Field(default_factory=dict)
    services: list[Service] = Field(default_factory=list)
    checks: dict[str, Check] = Field(default_factory=dict)
    standbys: list[str] = Field(default_factory=list)
    auto_destroy: bool = False
    processes: list[MachineProcess] = Field(default_factory=list)
    schedule: Schedule | None = None
    metrics: MachineMetrics | None = None
    disable_machine_autostart: bool | None = None
    mounts: list[Mount] = Field(default_factory=list)
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

    @field_validator("env")
    @classmethod
    def _env_names(cls, env: dict[str, str], info: ValidationInfo) -> dict[str, str]:
        if incoming(info):
            at_most(env, limits.MAX_ENV, "environment variables")
        return check_env(env)

    @field_validator("mounts")
    @classmethod
    def _one_mount(cls, mounts: list[Mount], info: ValidationInfo) -> list[Mount]:
        if incoming(info):  # one volume per machine, as Fly has it
            at_most(mounts, limits.MAX_MOUNTS, "mounts")
        return mounts

    @field_validator("services")
    @classmethod
    def _few_services(cls, services: list[Service], info: ValidationInfo) -> list[Service]:
        if incoming(info):
            at_most(services, limits.MAX_SERVICES, "services")
        return services

    @field_validator("processes")
    @classmethod
    def _few_processes(
        cls, processes: list[MachineProcess], info: ValidationInfo
    ) -> list[MachineProcess]:
        if incoming(info):
            at_most(processes, limits.MAX_PROCESSES, "processes")
        return processes

    @field_validator("standbys")
    @classmethod
    def _few_standbys(cls, standbys: list[str], info: ValidationInfo) -> list[str]:
        if incoming(info):
            at_most(standbys, limits.MAX_STANDBYS, "standbys")
        return standbys

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
        image's command. Several (or one with its own user) need a guest init, which the vm
        driver's machines have: workers that cannot run them refuse them at admission."""
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
