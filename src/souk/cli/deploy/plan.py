"""The pure part of a deploy: what the app's machines are, and what must change to reach the
desired release. No I/O here, so every decision can be tested on plain data.

An *instance* is one primary machine (started, serving) plus at most one standby (stopped, its
`config.standbys` naming the primary, on another worker of the same region). A deploy keeps
`count` instances per region. Only machines carrying the `souk.role` metadata are the deploy's;
any other machine of the app is left alone.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

from pydantic import BaseModel, ConfigDict, Field

from souk.cli.deploy.config import SECRETS_KEY
from souk.models.api import PublicMachine
from souk.models.machine_config import MachineConfig
from souk.models.wire import HIDDEN_KEY, RELEASE_KEY, ROLE_KEY

RUNNING = ("started", "starting")


class CheckView(BaseModel):
    model_config = ConfigDict(extra="ignore")

    name: str
    status: str
    output: str = ""
    updated_at: str = ""


class EventView(BaseModel):
    model_config = ConfigDict(extra="ignore")

    id: int  # Fly sends it as a string of digits
    type: str  # Fly's: launch, start, stop, exit, ...
    status: str = ""
    timestamp: int = 0
    request: dict[str, Any] = Field(default_factory=dict)
    step: str = ""  # souk's step within the operation


class MachineView(BaseModel):
    """What a deploy reads of a public machine; unknown fields are ignored."""

    model_config = ConfigDict(extra="ignore")

    id: str
    region: str
    worker: str = ""
    state: str
    instance_id: str = ""
    config: MachineConfig
    exit_code: int | None = None
    restart_count: int = 0
    created_at: str = ""
    private_ip: str | None = None
    checks: list[CheckView] = Field(default_factory=list)
    events: list[EventView] = Field(default_factory=list)

    @classmethod
    def of(cls, machine: PublicMachine) -> MachineView:
        return cls.model_validate(machine, from_attributes=True)

    @property
    def role(self) -> str | None:
        return self.config.metadata.get(ROLE_KEY)

    @property
    def release(self) -> int | None:
        value = self.config.metadata.get(RELEASE_KEY, "")
        return int(value) if value.isascii() and value.isdigit() else None

    @property
    def hidden(self) -> bool:
        return self.config.metadata.get(HIDDEN_KEY) == "true"

    @property
    def standby_for(self) -> str | None:
        return self.config.standbys[0] if self.config.standbys else None

    @property
    def fingerprint(self) -> str:
        return fingerprint(self.config)

    def health(self) -> str:
        """`3/3 passing`, `1/2 passing`; `-` without checks or when not started."""
        if not self.config.checks or self.state != "started":
            return "-"
        passing = sum(1 for c in self.checks if c.status == "passing")
        return f"{passing}/{len(self.config.checks)} passing"


def fingerprint(config: MachineConfig) -> str:
    """What makes two machines run the same thing: the config without the deploy's marks
    (metadata) and standby links, which change in place without a restart, and its volume
    (each machine has its own, kept through updates); but with the digest of the app's secrets
    it runs with (its env), which only an update changes."""
    data = config.model_dump(mode="json", exclude={"metadata", "standbys", "mounts"})
    data["secrets"] = config.metadata.get(SECRETS_KEY, "")
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()[:16]


@dataclass
class Instance:
    region: str
    primary: MachineView
    standby: MachineView | None = None

    def machines(self) -> list[MachineView]:
        return [self.primary, *([self.standby] if self.standby else [])]


@dataclass
class Inventory:
    """The app's machines, sorted into instances, leftovers and machines not the deploy's."""

    instances: list[Instance] = field(default_factory=list)
    leftovers: list[MachineView] = field(default_factory=list)
    unmanaged: list[MachineView] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        out: dict[str, int] = {}
        for inst in self.instances:
            out[inst.region] = out.get(inst.region, 0) + 1
        return out

    def managed(self) -> list[MachineView]:
        return [m for inst in self.instances for m in inst.machines()] + self.leftovers


def sort_fleet(machines: list[MachineView]) -> Inventory:
    """Primaries with their standby. Leftovers are machines a deploy made but no instance
    owns: a canary, hidden blue/green machines of an interrupted deploy, a second standby, a
    standby whose primary is gone."""
    fleet = Inventory()
    live = [m for m in machines if m.state not in ("destroying", "destroyed")]
    by_id: dict[str, Instance] = {}
    for m in sorted(live, key=lambda m: (m.created_at, m.id)):
        if m.role is None:
            fleet.unmanaged.append(m)
        elif m.role == "primary" and not m.hidden:
            inst = Instance(m.region, m)
            by_id[m.id] = inst
            fleet.instances.append(inst)
    for m in sorted(live, key=lambda m: (m.created_at, m.id)):
        if m.role is None or m.id in by_id:
            continue
        owner = by_id.get(m.standby_for or "") if m.role == "standby" else None
        if owner is not None and owner.standby is None and not m.hidden:
            owner.standby = m
        else:
            fleet.leftovers.append(m)
    return fleet


@dataclass
class Plan:
    """What a deploy does, before it does it."""

    release: int
    fingerprint: str
    standbys: bool
    keep: list[Instance] = field(default_factory=list)
    create: dict[str, int] = field(default_factory=dict)
    remove: list[Instance] = field(default_factory=list)
    leftovers: list[MachineView] = field(default_factory=list)
    unmanaged: list[MachineView] = field(default_factory=list)

    def outdated(self, m: MachineView) -> bool:
        """It runs another config: it needs an update (a restart, for a started machine)."""
        return m.fingerprint != self.fingerprint

    def relabel(self, m: MachineView) -> bool:
        """Same config, another release's marks: changed in place, no restart."""
        return not self.outdated(m) and m.release != self.release

    def updates(self) -> list[Instance]:
        return [i for i in self.keep if self.outdated(i.primary)]

    def missing_standbys(self) -> list[Instance]:
        return [i for i in self.keep if self.standbys and i.standby is None]

    def extra_standbys(self) -> list[MachineView]:
        if self.standbys:
            return []
        return [i.standby for i in self.keep if i.standby is not None]

    def summary(self) -> dict[str, Any]:
        return {
            "release": self.release,
            "update": [i.primary.id for i in self.updates()],
            "relabel": [m.id for i in self.keep for m in i.machines() if self.relabel(m)],
            "create": dict(self.create),
            "remove": [m.id for i in self.remove for m in i.machines()],
            "leftovers": [m.id for m in self.leftovers],
            "standbys_to_create": len(self.missing_standbys()),
            "standbys_to_remove": [m.id for m in self.extra_standbys()],
        }


def _removal_order(fp: str, instances: list[Instance]) -> list[Instance]:
    """Which instances go first when a region shrinks: not running, then outdated, then the
    newest (the oldest have proven themselves)."""
    out = sorted(instances, key=lambda i: (i.primary.created_at, i.primary.id), reverse=True)
    return sorted(out, key=lambda i: (i.primary.state in RUNNING, i.primary.fingerprint == fp))


def plan(
    desired: dict[str, int],
    config_fingerprint: str,
    release: int,
    machines: list[MachineView],
    standbys: bool = True,
) -> Plan:
    """Reach `desired` instances per region running the config with `config_fingerprint`,
    marked as `release`. Regions not in `desired` lose their instances."""
    fleet = sort_fleet(machines)
    out = Plan(
        release,
        config_fingerprint,
        standbys,
        leftovers=list(fleet.leftovers),
        unmanaged=list(fleet.unmanaged),
    )
    regions = sorted({*desired, *(i.region for i in fleet.instances)})
    for region in regions:
        have = [i for i in fleet.instances if i.region == region]
        want = desired.get(region, 0)
        if len(have) > want:
            ordered = _removal_order(config_fingerprint, have)
            out.remove.extend(ordered[: len(have) - want])
            have = ordered[len(have) - want :]
        elif want > len(have):
            out.create[region] = want - len(have)
        out.keep.extend(sorted(have, key=lambda i: (i.primary.created_at, i.primary.id)))
    return out
