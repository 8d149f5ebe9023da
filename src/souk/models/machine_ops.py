"""Bodies of the routes that act on a running machine without changing its config: signal,
exec, ps, and the list of its config versions. Named as in Fly's Machines API."""

from __future__ import annotations

import signal as signals
from typing import Any

from pydantic import BaseModel, Field, field_validator, model_validator

from souk.models.base import Strict
from souk.models.machine import SIGNALS, MachineConfig, normalize_signal

MAX_EXEC_TIMEOUT = 300  # seconds: an exec holds a connection open for as long
DEFAULT_EXEC_TIMEOUT = 30
MAX_EXEC_OUTPUT = 1 << 20  # bytes kept of each of stdout and stderr
MAX_STDIN = 1 << 20


class SignalRequest(Strict):
    """A signal by name (`SIGHUP`, `HUP`), as Fly's spec has it, or by number as older Fly
    clients send it; a number is read with the numbering of the host that reads it (Linux)."""

    signal: str

    @field_validator("signal", mode="before")
    @classmethod
    def _named(cls, value: Any) -> str:
        if isinstance(value, int) and not isinstance(value, bool):
            try:
                name = signals.Signals(value).name
            except ValueError:
                raise ValueError(f"unknown signal number {value}") from None
            if name not in SIGNALS:
                raise ValueError(f"signal {name} cannot be sent: one of {sorted(SIGNALS)}")
            return name
        if not isinstance(value, str):
            raise ValueError("a signal name such as SIGHUP, or its number")
        return normalize_signal(value)


class ExecRequest(Strict):
    """A command to run inside the machine: `command` (argv), or Fly's deprecated `cmd`, one
    string split on whitespace. `timeout` in seconds; `stdin` is fed to the command."""

    command: list[str] | None = Field(None, min_length=1, max_length=256)
    cmd: str | None = Field(None, max_length=64 << 10)
    stdin: str | None = Field(None, max_length=MAX_STDIN)
    timeout: int = Field(DEFAULT_EXEC_TIMEOUT, ge=1, le=MAX_EXEC_TIMEOUT)
    container: str | None = None

    @field_validator("container")
    @classmethod
    def _no_containers(cls, value: str | None) -> str | None:
        if value:
            raise ValueError("souk machines have one container; leave container out")
        return value

    @model_validator(mode="after")
    def _one_command(self) -> ExecRequest:
        if not self.argv():
            raise ValueError("command: a non-empty list of arguments (or cmd, a string)")
        return self

    def argv(self) -> list[str]:
        if self.command:
            return list(self.command)
        return (self.cmd or "").split()


class ExecResponse(BaseModel):
    """Fly's `flydv1.ExecResponse`: `exit_signal` only when a signal ended the command."""

    stdout: str
    stderr: str
    exit_code: int
    exit_signal: int | None = None


class SocketHolder(BaseModel):
    """Whether a machine's processes hold a socket, named by its inode: the proxy asks before
    it sends a request to what listens at the machine's address (docs/proxy.md)."""

    inode: int
    held: bool


class ListenSocket(BaseModel):
    proto: str
    address: str


class ProcessStat(BaseModel):
    """One process of a machine, as Fly's `ProcessStat`: `pid` as the host sees it, `rss` in
    bytes, `rtime`/`stime` user and system CPU time in milliseconds, `cpu` the percentage of one
    CPU it has used since it started."""

    pid: int
    command: str
    directory: str
    cpu: int
    rss: int
    rtime: int
    stime: int
    listen_sockets: list[ListenSocket] = Field(default_factory=list)


class MachineVersion(BaseModel):
    """One config a machine has had: `version` is the instance id it ran under."""

    version: str
    user_config: MachineConfig
    created_at: str
