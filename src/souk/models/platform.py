"""Bodies of the platform and organisation routes, named as in Fly's Machines API: regions with
their capacity, the market's quote of where machines would go, every machine of an
organisation, and what the presented token is."""

from __future__ import annotations

from pydantic import BaseModel, Field

from souk.models.api import TokenInfo
from souk.models.base import Strict
from souk.models.machine import GuestConfig, MachineState


class RegionCapacity(BaseModel):
    """Fly's `reads.GetCapacityPerRegionRow`: `capacity` is how many machines of the asked
    guest the region's workers could take now."""

    code: str
    name: str
    capacity: int
    workers: int  # souk's: reachable workers in the region


class RegionsResponse(BaseModel):
    regions: list[RegionCapacity]


class PlacementsRequest(Strict):
    """Fly's `main.getPlacementsRequest`. `region`: a comma-separated list of regions, in order
    of preference (absent, empty or `any`: every region)."""

    org_slug: str = Field(min_length=1, max_length=63)
    compute: GuestConfig | None = None
    count: int = Field(0, ge=0, le=10_000)
    region: str | None = Field(None, max_length=1024)
    volume_name: str | None = None
    volume_size_bytes: int | None = None
    weights: dict[str, int] | None = None


class RegionPlacement(BaseModel):
    region: str
    count: int


class PlacementsResponse(BaseModel):
    regions: list[RegionPlacement]


class OrgMachine(BaseModel):
    """Fly's `OrgMachine`, from the catalog (souk keeps no app ids: `app_id` is left out)."""

    id: str
    name: str
    app_name: str
    state: MachineState
    region: str
    instance_id: str
    private_ip: str | None = None
    updated_at: str


class OrgMachinesResponse(BaseModel):
    machines: list[OrgMachine]
    last_machine_id: str | None = None
    last_updated_at: str | None = None
    next_cursor: str | None = None


class FlyToken(BaseModel):
    """One entry of Fly's `CurrentTokenResponse`."""

    token_id: str
    apps: list[str] | None = None
    org_slug: str | None = None


class CurrentToken(TokenInfo):
    """souk's own fields, and Fly's `tokens` list beside them."""

    tokens: list[FlyToken]


class DeployTokenRequest(Strict):
    expiry: str | None = Field(None, max_length=64)


class DeployTokenResponse(BaseModel):
    token: str
