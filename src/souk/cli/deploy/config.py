"""`souk.toml`: what an app should look like, read with tomllib and checked by pydantic.

Everything a machine runs with comes from here; `machine_config` turns it into the Machines
API's config for one role of one release. Sections reuse the API's own models (guest, services,
checks, restart), so a value the broker would refuse is refused here first, with its field.
"""

from __future__ import annotations

import math
import tomllib
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, field_validator, model_validator

from souk.cli.command import CommandError, problems
from souk.models.api import REGION_NAME
from souk.models.base import AppName, Strict
from souk.models.config_rules import ENV_NAME
from souk.models.duration import Duration
from souk.models.guest import GuestConfig
from souk.models.machine_config import InitConfig, MachineConfig, Mount, RestartConfig, StopConfig
from souk.models.services import Check, Service
from souk.models.volume import CreateVolumeRequest
from souk.models.wire import HIDDEN_KEY, RELEASE_KEY, ROLE_KEY, Role

SECRETS_KEY = "souk_secrets"  # machine metadata: the digest of the app's secrets it runs with

StrategyName = Literal["rolling", "immediate", "canary", "bluegreen"]


class ConfigError(CommandError):
    """souk.toml is unreadable or invalid; the message names every bad field."""

    code = 2


class DeploySection(Strict):
    strategy: StrategyName = "rolling"
    max_unavailable: float = Field(
        1, gt=0, description="Machines updated at once: a count (1, 2, ...) or a fraction (0.25)."
    )
    standbys: bool = True
    wait_timeout: Duration = Field(120.0, gt=0)
    settle: Duration = Field(
        1.0, ge=0, description="With no checks: how long a new machine must stay started."
    )

    @field_validator("max_unavailable")
    @classmethod
    def _count_or_fraction(cls, value: float) -> float:
        if value > 1 and value != int(value):
            raise ValueError("a whole number of machines, or a fraction between 0 and 1")
        return value

    def batch_size(self, total: int) -> int:
        if self.max_unavailable < 1:
            return max(1, math.ceil(self.max_unavailable * total))
        return int(self.max_unavailable)


class MountsSection(Strict):
    """`[mounts]`: each primary machine gets a volume of its own, made when the machine is, on
    the worker the machine then runs on (Fly's `source`, `destination`)."""

    source: str = Field(description="The volumes' name.")
    destination: str = Field(description="Where the machine sees its volume, e.g. /data.")
    initial_size_gb: int | None = Field(None, ge=1)
    initial_size_mb: int | None = Field(None, ge=8)
    snapshot_retention: int = Field(5, ge=1, le=60)

    @model_validator(mode="after")
    def _checked(self) -> MountsSection:
        # the same rules as the API's, refused here with the section's field names
        CreateVolumeRequest(name=self.source, size_mb=8)
        Mount(volume="vol_000000", path=self.destination)
        if self.initial_size_gb is not None and self.initial_size_mb is not None:
            raise ValueError("initial_size_gb or initial_size_mb, not both")
        return self

    def size(self) -> dict[str, int]:
        if self.initial_size_mb is not None:
            return {"size_mb": self.initial_size_mb}
        return {"size_gb": self.initial_size_gb or 1}


class BuildSection(Strict):
    """`[build]`: the app's image is built from a Dockerfile beside souk.toml at each deploy
    (with buildah), pushed to `image` (a repository: `registry/name`, no tag; none: `souk
    dev`'s registry, as `<its address>/<app>`) and deployed by its digest (`build.py`)."""

    image: str | None = Field(
        None,
        min_length=1,
        max_length=400,
        pattern=r"^[a-z0-9][a-z0-9.:-]*(/[a-z0-9._-]+)+$",
        description="The repository each build is pushed to, e.g. registry.example:5000/hello"
        " (default: the registry of the souk dev this directory is below).",
    )
    dockerfile: str = "Dockerfile"
    context: str = "."
    tls_verify: bool = Field(True, description="false: push over plain http (a local registry).")


class AppConfig(Strict):
    """The whole of souk.toml."""

    app: AppName
    image: str | None = Field(None, max_length=512)
    command: list[str] | None = None
    regions: dict[str, int] = Field(description="region -> machines (instances) there")
    guest: GuestConfig = Field(default_factory=GuestConfig)
    env: dict[str, str] = Field(default_factory=dict)
    services: list[Service] = Field(default_factory=list)
    checks: dict[str, Check] = Field(default_factory=dict)
    restart: RestartConfig = Field(default_factory=RestartConfig)
    stop: StopConfig = Field(default_factory=StopConfig)
    deploy: DeploySection = Field(default_factory=DeploySection)
    mounts: MountsSection | None = None
    build: BuildSection | None = None

    @field_validator("command")
    @classmethod
    def _argv(cls, command: list[str] | None) -> list[str] | None:
        if command is not None and (not command or not command[0]):
            raise ValueError("the command is an argv list with at least the program")
        return command

    @model_validator(mode="before")
    @classmethod
    def _region_list(cls, data: Any) -> Any:
        """`regions = ["mad", "ams"]` with `count = 2` means two in each."""
        if not isinstance(data, dict):
            return data
        regions, count = data.get("regions"), data.get("count")
        if isinstance(regions, list):
            if count is None:
                raise ValueError("count: needed when regions is a list (machines per region)")
            if not isinstance(count, int) or isinstance(count, bool) or count < 0:
                raise ValueError("count: a whole number of machines per region, 0 or more")
            if not all(isinstance(r, str) for r in regions):
                raise ValueError("regions: a list of region names")
            if len(set(regions)) != len(regions):
                raise ValueError("regions: a region is listed twice")
            return {
                **{k: v for k, v in data.items() if k != "count"},
                "regions": dict.fromkeys(regions, count),
            }
        if count is not None:
            raise ValueError("count: only with a list of regions; a table gives each its count")
        return data

    @field_validator("regions")
    @classmethod
    def _regions(cls, regions: dict[str, int]) -> dict[str, int]:
        if not regions:
            raise ValueError("at least one region")
        for name, count in regions.items():
            if not REGION_NAME.match(name):
                raise ValueError(f"{name!r} is not a region name (e.g. 'mad')")
            if count < 0:
                raise ValueError(f"{name}: a count cannot be negative")
        return regions

    @field_validator("env")
    @classmethod
    def _env(cls, env: dict[str, str]) -> dict[str, str]:
        for name in env:
            if not ENV_NAME.match(name):
                raise ValueError(f"bad environment variable name {name!r}")
        return env

    @model_validator(mode="after")
    def _consistent(self) -> AppConfig:
        given = [self.image is not None, self.command is not None, self.build is not None]
        if given.count(True) != 1:
            raise ValueError(
                "image, command, build: give exactly one (an OCI reference, an argv list, or a"
                " [build] section to build a Dockerfile)"
            )
        if self.mounts is not None and self.deploy.strategy not in ("rolling", "immediate"):
            raise ValueError(
                "deploy.strategy: with [mounts], rolling or immediate (they update machines in"
                " place, on their volumes; a canary or a blue/green machine would start empty)"
            )
        return self

    @property
    def standbys(self) -> bool:
        """A standby cannot share its primary's volume (one machine per volume, and not on
        another worker): with [mounts], a deploy makes none."""
        return self.deploy.standbys and self.mounts is None

    def machine_config(
        self,
        release: int,
        role: Role,
        standby_for: str | None = None,
        hidden: bool = False,
        secrets: str = "",
        volume: str | None = None,
    ) -> MachineConfig:
        """The Machines API config for one machine of this release (`volume`: the one it
        mounts at [mounts].destination). Its env is not in it: the deploy keeps the values as
        the app's secrets, which every machine of the app gets; `secrets`, their digest, marks
        which values the machine runs with."""
        metadata = {ROLE_KEY: role, RELEASE_KEY: str(release)}
        if hidden:
            metadata[HIDDEN_KEY] = "true"
        if secrets:
            metadata[SECRETS_KEY] = secrets
        return MachineConfig(
            image=self.image,
            init=InitConfig(exec=self.command) if self.command else InitConfig(),
            guest=self.guest,
            restart=self.restart,
            stop_config=self.stop,
            metadata=metadata,
            services=list(self.services),
            checks=dict(self.checks),
            standbys=[standby_for] if standby_for else [],
            mounts=[Mount(volume=volume, path=self.mounts.destination)]
            if volume is not None and self.mounts is not None
            else [],
        )


def parse(data: dict[str, Any]) -> AppConfig:
    try:
        return AppConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(problems(exc)) from None


def loads(text: str) -> AppConfig:
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"not valid TOML: {exc}") from None
    return parse(data)


def load(path: Path) -> AppConfig:
    try:
        text = path.read_text()
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror or exc}") from None
    try:
        config = loads(text)
    except ConfigError as exc:
        raise ConfigError(f"{path}: {exc}") from None
    return beside(config, path.resolve().parent)


def beside(config: AppConfig, folder: Path) -> AppConfig:
    """Command arguments written `./...` name files next to souk.toml: they are made absolute,
    since a machine runs in a directory of its own on its worker; so are a build's paths."""
    if config.build is not None:
        build = config.build
        paths = {k: str(folder / getattr(build, k)) for k in ("dockerfile", "context")}
        config = config.model_copy(update={"build": build.model_copy(update=paths)})
    if not config.command:
        return config
    argv = [str(folder / a[2:]) if a.startswith("./") else a for a in config.command]
    return config.model_copy(update={"command": argv})
