"""The image config (what the image says to run, and how) and how a machine's config overrides it,
with Docker's rules: an entrypoint override drops the image's cmd."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from souk.models.machine import InitConfig
from souk.worker.oci.manifest import ManifestError


def _strings(value: Any) -> list[str] | None:
    if value is None:
        return None
    if isinstance(value, str):
        return ["/bin/sh", "-c", value]
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return list(value)
    raise ManifestError(f"expected a list of strings in the image config, got {value!r}")


@dataclass(frozen=True)
class ImageConfig:
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: list[str] = field(default_factory=list)  # NAME=value, in order
    workdir: str = "/"
    user: str = ""
    exposed_ports: list[str] = field(default_factory=list)  # "80/tcp"
    os: str = "linux"
    architecture: str = ""

    @classmethod
    def parse(cls, data: bytes) -> ImageConfig:
        try:
            doc = json.loads(data)
        except ValueError as e:
            raise ManifestError(f"image config is not JSON: {e}") from e
        body = doc.get("config") or {} if isinstance(doc, dict) else None
        if not isinstance(body, dict):
            raise ManifestError("image config has no config object")
        return cls(
            entrypoint=_strings(body.get("Entrypoint")),
            cmd=_strings(body.get("Cmd")),
            env=_strings(body.get("Env")) or [],
            workdir=str(body.get("WorkingDir") or "/"),
            user=str(body.get("User") or ""),
            exposed_ports=sorted(body.get("ExposedPorts") or {}),
            os=str(doc.get("os", "linux")),
            architecture=str(doc.get("architecture", "")),
        )

    def argv(self, init: InitConfig) -> list[str]:
        """What the container runs: init.exec; else entrypoint and cmd, each overridable."""
        if init.exec:
            return list(init.exec)
        if init.entrypoint is not None:
            return [*init.entrypoint, *(init.cmd or [])]
        cmd = init.cmd if init.cmd is not None else self.cmd
        return [*(self.entrypoint or []), *(cmd or [])]

    def environment(self, overrides: dict[str, str]) -> list[str]:
        """The image's environment with the machine's on top, as NAME=value."""
        merged: dict[str, str] = {}
        for item in self.env:
            name, _, value = item.partition("=")
            merged[name] = value
        merged.update(overrides)
        merged.setdefault("PATH", "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin")
        return [f"{k}={v}" for k, v in merged.items()]

    def ports(self) -> list[int]:
        """Exposed TCP ports."""
        found = []
        for spec in self.exposed_ports:
            port, _, proto = spec.partition("/")
            if (proto or "tcp") == "tcp" and port.isdigit():
                found.append(int(port))
        return found
