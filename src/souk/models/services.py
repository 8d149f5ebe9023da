"""A machine's services (the ports the proxy routes to it), its health checks, and where it
serves its own metrics."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Annotated, Any, Literal

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from souk.models import limits
from souk.models.base import Strict
from souk.models.config_rules import refused
from souk.models.duration import Duration
from souk.models.limits import at_most, bounded, in_range, incoming


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


Ports = Annotated[list[ServicePort], bounded(limits.MAX_PORTS, "ports in a service")]


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
    ports: Ports = Field(default_factory=list)
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


CheckState = Literal["passing", "warning", "critical"]


class CheckStatus(BaseModel):
    """The latest result of one of the machine's checks, as Fly reports them: `warning` until
    the first pass and during the grace period, `critical` on a failure, `output` saying why."""

    name: str
    status: CheckState
    output: str = ""
    updated_at: str
