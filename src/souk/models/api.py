"""The public Machines API's bodies, shaped like Fly.io's so its clients work against souk.

Machine configs are `souk.models.machine.MachineConfig`, which already uses Fly's field names.
Fields Fly accepts that souk has no use for yet (`skip_service_registration`, `lsvd`, ...) are
accepted and ignored so that existing clients are not refused; anything else unknown is a 400.
"""

from __future__ import annotations

import re
from typing import Any, Literal

from pydantic import BaseModel, Field, field_validator, model_validator

from souk.models.base import AppName, Strict
from souk.models.errors import ErrorBody
from souk.models.machine import (
    CreateMachine,
    Machine,
    MachineConfig,
    check_metadata_size_in_model,
)

NONCE_HEADER = "fly-machine-lease-nonce"
# Sent by a broker with a create: seconds the worker holds the machine as provisional, destroying
# it unless the broker confirms (POST /v1/confirmations) that it answered its client.
HOLD_HEADER = "souk-provisional-hold"

REGION_NAME = re.compile(r"^[a-z][a-z0-9-]{1,31}\Z")
Strategy = Literal["auto", "offers", "p2c", "catalog"]


def _check_region(value: str) -> str:
    if not REGION_NAME.match(value):
        raise ValueError("one region name, e.g. 'mad'; lists and aliases are not accepted")
    return value


class _FlyIgnored(Strict):
    """Accepted for compatibility with Fly's clients; souk ignores them."""

    skip_service_registration: bool | None = None
    skip_secrets: bool | None = None
    lsvd: bool | None = None
    min_secrets_version: int | None = None


class CreateMachineRequest(_FlyIgnored):
    name: str | None = Field(None, max_length=63)
    region: str | None = Field(
        None,
        description="Exactly one region; souk never places anywhere else. Left out: the"
        " broker's default region if it has one, else the best offer of every region.",
    )
    config: MachineConfig
    skip_launch: bool = False
    lease_ttl: int | None = Field(None, ge=1, le=3600)
    avoid_workers: list[str] = Field(
        default_factory=list,
        max_length=64,
        description="souk extension: never place on these workers (e.g. a standby away from"
        " its primary's worker); no other worker fitting is a 412.",
    )

    @field_validator("region")
    @classmethod
    def _one_region(cls, region: str | None) -> str | None:
        return None if region is None else _check_region(region)


class UpdateMachineRequest(_FlyIgnored):
    config: MachineConfig
    name: str | None = Field(None, max_length=63)
    region: str | None = Field(None, description="If given, must be the machine's region.")
    skip_launch: bool = False
    current_version: str | None = Field(None, description="Refuse with 412 unless current.")
    lease_ttl: int | None = Field(None, ge=1, le=3600)


class CreateAppRequest(Strict):
    """`name`, or `app_name` as Fly's older documentation and clients send it."""

    name: AppName = Field(max_length=63)
    org_slug: str = "personal"
    # the private network it shares with the org's apps created with the same (docs/network.md)
    network: str | None = Field(None, pattern=r"^[a-z0-9][a-z0-9_-]{0,62}$")
    enable_subdomains: bool | None = None

    @model_validator(mode="before")
    @classmethod
    def _app_name_alias(cls, data: Any) -> Any:
        if not isinstance(data, dict) or "app_name" not in data:
            return data
        rest = {k: v for k, v in data.items() if k != "app_name"}
        if rest.get("name") not in (None, data["app_name"]):
            raise ValueError("name and app_name differ: send one of them")
        return {**rest, "name": data["app_name"]}


class AppOrganization(BaseModel):
    slug: str
    name: str


class App(BaseModel):
    id: str
    name: str
    status: str = "deployed"
    organization: AppOrganization
    machine_count: int = 0
    volume_count: int = 0
    network: str = "default"
    created_at: str


class ListAppsResponse(BaseModel):
    total_apps: int
    apps: list[App]


class ImageRef(BaseModel):
    """An image machine's image, split as Fly shows it."""

    registry: str
    repository: str
    tag: str = ""
    digest: str = ""
    labels: dict[str, str] = Field(default_factory=dict)


class PinImageRequest(Strict):
    """souk extension: which digest an image's tag names now, asked of a worker (of `region`,
    else of any region), which reaches registries with its own credentials."""

    image: str = Field(min_length=1, max_length=512)
    region: str | None = None

    @field_validator("region")
    @classmethod
    def _one_region(cls, region: str | None) -> str | None:
        return None if region is None else _check_region(region)


# `images/pin`'s refusals that are the image's own (a bad reference, no such image or tag): no
# other worker would answer otherwise.
IMAGE_FAULTS = (400, 404)


class PinnedImage(BaseModel):
    """`image` with the digest its tag names now (`registry/name:tag@sha256:...`)."""

    image: str
    digest: str


class PublicMachine(Machine):
    """Fly's machine shape plus souk's own fields (`worker`, `restart_count`, `exit_code`).
    Sent with empty (None) fields left out, as Fly's omitempty does."""

    host_status: Literal["ok", "unknown", "unreachable"] = "ok"
    nonce: str | None = Field(None, description="The lease nonce, when lease_ttl was given.")
    image_ref: ImageRef | None = None


class CreateLeaseRequest(Strict):
    description: str = Field("", max_length=256)
    ttl: int = Field(60, ge=1, le=3600)


class WorkerLeaseRequest(CreateLeaseRequest):
    """What a broker asks a worker for: a lease request plus who is asking."""

    owner: str = Field("", max_length=256)


# Ids one confirmation may carry, alone or riding with a batch of creates.
MAX_CONFIRMATIONS = 1000


class Confirmations(Strict):
    """Machines whose creator answered its client: their provisional holds end."""

    ids: list[str] = Field(min_length=1, max_length=MAX_CONFIRMATIONS)


# Creates one batch may carry: about what a worker group-commits at once.
MAX_BATCH = 64


class CreateBatch(Strict):
    """Creates a broker sends one worker together (`POST /v1/machines/batch`), each reserved and
    answered as if it came alone: one refused leaves the others as they were. `confirm`: ids of
    earlier creates whose holds end, as `POST /v1/confirmations` would end them, riding along
    so that a broker creating on a worker needs no request of their own."""

    machines: list[CreateMachine] = Field(min_length=1, max_length=MAX_BATCH)
    # None, not empty, when there are none: a batch without any is then what it was before
    confirm: list[str] | None = Field(None, max_length=MAX_CONFIRMATIONS)


class CreateOutcome(BaseModel):
    """One create of a batch: its machine (`status` 201), or the error it would have had alone."""

    status: int
    machine: Machine | None = None
    error: ErrorBody | None = None


HoldAnswer = Literal["confirmed", "expired", "unknown"]


class BusReservation(Strict):
    """A batch of creates sent to a worker on the bus (`reserve_subject`) instead of `POST
    /v1/machines/batch`: the same body, and the hold the HTTP call gives in `HOLD_HEADER`. The
    worker answers with `CreateOutcomes`, or `BusRefusal` when it takes no reservation."""

    batch: CreateBatch
    hold: float | None = None


class BusRefusal(BaseModel):
    """A worker's answer to a `BusReservation` it will not handle: the HTTP status it would
    have answered and why."""

    status: int
    error: ErrorBody


class CreateOutcomes(BaseModel):
    """The batch's outcomes, in the order of its creates, and each confirmed id's hold (as
    `ConfirmationResult` gives it; an id missing was not confirmed, to be sent again)."""

    outcomes: list[CreateOutcome]
    holds: dict[str, HoldAnswer] = Field(default_factory=dict)


class ConfirmationResult(BaseModel):
    """Each id's hold: confirmed, expired (too late: being destroyed) or unknown."""

    holds: dict[str, HoldAnswer]


class Lease(BaseModel):
    nonce: str
    expires_at: int  # unix seconds
    owner: str
    description: str
    version: str  # the machine's instance id when the lease was taken


class MetadataValue(Strict):
    value: str = Field(max_length=4096)


class MetadataPatch(Strict):
    """Several keys at once; null or empty values remove keys."""

    metadata: dict[str, str | None]
    machine_version: str | None = None

    @field_validator("metadata")
    @classmethod
    def _size(cls, metadata: dict[str, str | None]) -> dict[str, str | None]:
        check_metadata_size_in_model(metadata)  # a patch over the limit can never fit
        return metadata


class OkResponse(BaseModel):
    ok: bool = True


class Refusal(BaseModel):
    """Why one worker did not take a machine, as reported in a 412."""

    worker: str
    reason: str


class WorkerInfo(BaseModel):
    """A worker as the catalog shows it: souk's own fleet endpoint, for operators."""

    id: str
    region: str
    address: str
    cpus_total: int
    cpus_free: int
    memory_mb_total: int
    memory_mb_free: int
    machines: int
    cordoned: bool
    reachable: bool


class TokenInfo(BaseModel):
    """What the token presented allows: each list the intersection of its caveats, left out
    (None) for no limit on that dimension."""

    id: str = Field(description="Revoking this id revokes every token attenuated from it.")
    operator: bool
    actions: list[str]
    apps: list[str] | None = None
    machines: list[str] | None = None
    regions: list[str] | None = None
    expires: int | None = Field(None, description="Unix seconds; left out: it does not expire.")


def image_ref(image: str, runs: str | None = None) -> ImageRef:
    """`registry/repository:tag@digest` split as Fly's `image_ref` shows it; a name without a
    registry host is Docker Hub's, as Docker reads it. `runs`: the digest the machine runs,
    for a reference that names none."""
    rest, _, digest = image.partition("@")
    digest = digest or runs or ""
    tag = ""
    slash, colon = rest.rfind("/"), rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
    first, sep, remainder = rest.partition("/")
    if sep and ("." in first or ":" in first or first == "localhost"):
        registry, repository = first, remainder
    else:
        registry, repository = "docker.io", rest if "/" in rest else f"library/{rest}"
    return ImageRef(registry=registry, repository=repository, tag=tag, digest=digest)
