"""The public Machines API, for the CLI, its deploys and the proxy: one typed method per call,
bodies and answers in the shared models, and the only place the API's paths are spelled on
the client side."""

from __future__ import annotations

import asyncio
import ssl
from collections.abc import AsyncIterator, Collection, Mapping
from pathlib import Path
from typing import Any

import orjson
from pydantic import BaseModel, TypeAdapter

from souk.clients.http import ClientError, HttpClient, Tls
from souk.models.api import (
    NONCE_HEADER,
    App,
    CreateAppRequest,
    CreateLeaseRequest,
    CreateMachineRequest,
    Lease,
    ListAppsResponse,
    MetadataPatch,
    PinImageRequest,
    PinnedImage,
    PublicMachine,
    UpdateMachineRequest,
)
from souk.models.catalog import RevocationRow
from souk.models.guest import GuestConfig
from souk.models.machine import MachineState, MetadataChange, StopRequest
from souk.models.placement import PlacementExplanation
from souk.models.platform import RegionsResponse
from souk.models.secrets import AppSecrets, AppSecretsUpdateRequest, AppSecretsUpdateResp
from souk.models.volume import (
    CreateVolumeRequest,
    ExtendVolumeRequest,
    ExtendVolumeResponse,
    Volume,
    VolumeSnapshot,
)

WAIT_MAX = 60.0  # the broker's own bound on one wait
PIN_TIMEOUT = 35.0  # the broker asks up to three workers, 10 s each, which ask the registry

_MACHINES = TypeAdapter(list[PublicMachine])
_METADATA = TypeAdapter(dict[str, str])


class MachinesApiError(ClientError):
    """The broker refused (its status and reason), or could not be reached (status 0)."""

    def __str__(self) -> str:
        if self.http_status == 0:
            return self.message
        text = f"{self.http_status} {self.reason}: {self.message}"
        for refusal in self.details.get("refusals", []):
            text += f"\n  {refusal.get('worker')}: {refusal.get('reason')}"
        return text


def _path(collection: str, app: str, item: str, verb: str) -> str:
    """`/v1/apps/{app}/{collection}`, then the item's id and the verb where given."""
    return "/".join(part for part in (f"/v1/apps/{app}/{collection}", item, verb) if part)


def _machine_path(app: str, machine_id: str = "", verb: str = "") -> str:
    return _path("machines", app, machine_id, verb)


def _volume_path(app: str, volume_id: str = "", verb: str = "") -> str:
    return _path("volumes", app, volume_id, verb)


_VOLUMES = TypeAdapter(list[Volume])
_SNAPSHOTS = TypeAdapter(list[VolumeSnapshot])


class MachinesClient(HttpClient):
    """A bearer-token client of one broker (no token: only for what needs none, such as a
    catalog's status). Use as `async with MachinesClient(url, token) as api`. `ca`: the CA file
    an https broker's certificate is checked against instead of the system's (a private CA)."""

    def __init__(
        self, base_url: str, token: str | None, timeout: float = 60.0, ca: Path | None = None
    ) -> None:
        trust = ssl.create_default_context(cafile=ca) if ca is not None else None
        super().__init__(
            headers={"Authorization": f"Bearer {token}"} if token else None, tls=Tls(trust=trust)
        )
        self.base_url = base_url.rstrip("/")
        self.timeout = timeout

    async def _call(
        self,
        method: str,
        path: str,
        body: BaseModel | None = None,
        params: Mapping[str, str] | None = None,
        nonce: str | None = None,
        timeout: float | None = None,
    ) -> bytes:
        headers = {NONCE_HEADER: nonce} if nonce else None
        url = self.base_url + path
        return await self.send(
            MachinesApiError, method, url, body, params, headers, timeout or self.timeout
        )

    async def _machine(
        self,
        method: str,
        app: str,
        machine_id: str,
        verb: str = "",
        body: BaseModel | None = None,
        params: Mapping[str, str] | None = None,
        nonce: str | None = None,
    ) -> PublicMachine:
        path = _machine_path(app, machine_id, verb)
        return PublicMachine.model_validate_json(
            await self._call(method, path, body, params, nonce)
        )

    # --- apps ----------------------------------------------------------------------------

    async def apps(self) -> ListAppsResponse:
        return ListAppsResponse.model_validate_json(await self._call("GET", "/v1/apps"))

    async def app(self, name: str) -> App:
        return App.model_validate_json(await self._call("GET", f"/v1/apps/{name}"))

    async def app_exists(self, name: str) -> bool:
        try:
            await self._call("GET", f"/v1/apps/{name}")
        except MachinesApiError as exc:
            if exc.http_status == 404:
                return False
            raise
        return True

    async def create_app(self, req: CreateAppRequest) -> App:
        return App.model_validate_json(await self._call("POST", "/v1/apps", req))

    async def ensure_app(self, name: str) -> bool:
        """Create the app unless it exists; True if it was created."""
        if await self.app_exists(name):
            return False
        try:
            await self.create_app(CreateAppRequest(name=name))
        except MachinesApiError as exc:
            if exc.reason != "already_exists":
                raise
            return False
        return True

    async def delete_app(self, name: str) -> None:
        await self._call("DELETE", f"/v1/apps/{name}")

    async def app_metadata(self, name: str) -> dict[str, str]:
        return _METADATA.validate_json(await self._call("GET", f"/v1/apps/{name}/metadata"))

    async def patch_app_metadata(self, name: str, change: MetadataChange) -> None:
        await self._call("PATCH", f"/v1/apps/{name}/metadata", change)

    async def pin_image(self, app: str, image: str, region: str | None = None) -> PinnedImage:
        """`image` with the digest its tag names now, asked of a worker of `region`."""
        req = PinImageRequest(image=image, region=region)
        return PinnedImage.model_validate_json(
            await self._call("POST", f"/v1/apps/{app}/images/pin", req, timeout=PIN_TIMEOUT)
        )

    # --- the cluster ---------------------------------------------------------------------

    async def regions(self, guest: GuestConfig | None = None) -> RegionsResponse:
        """Every region with reachable workers, and how many machines of `guest` each could
        take now (nothing reserved)."""
        params: dict[str, str] = {}
        if guest is not None:
            params = {
                "cpu_kind": guest.cpu_kind,
                "cpus": str(guest.cpus),
                "memory_mb": str(guest.memory_mb),
            }
        return RegionsResponse.model_validate_json(
            await self._call("GET", "/v1/platform/regions", params=params)
        )

    # --- secrets -------------------------------------------------------------------------

    async def secrets(self, app: str) -> AppSecrets:
        return AppSecrets.model_validate_json(await self._call("GET", f"/v1/apps/{app}/secrets"))

    async def update_secrets(
        self, app: str, values: Mapping[str, str | None]
    ) -> AppSecretsUpdateResp:
        """Set several secrets at once (a None value unsets one): one new secrets version."""
        body = AppSecretsUpdateRequest(values=dict(values))
        answer = await self._call("POST", f"/v1/apps/{app}/secrets", body)
        return AppSecretsUpdateResp.model_validate_json(answer)

    # --- machines ------------------------------------------------------------------------

    async def machines(
        self,
        app: str,
        region: str | None = None,
        states: Collection[str] = (),
        include_deleted: bool = False,
    ) -> list[PublicMachine]:
        """The app's machines, filtered by the broker (which refuses an unknown state)."""
        params = {"region": region} if region else {}
        if states:
            params["state"] = ",".join(states)
        if include_deleted:
            params["include_deleted"] = "true"
        return _MACHINES.validate_json(await self._call("GET", _machine_path(app), params=params))

    async def machine(self, app: str, machine_id: str) -> PublicMachine:
        return await self._machine("GET", app, machine_id)

    async def placement(self, app: str, machine_id: str) -> PlacementExplanation:
        """Why the machine is where it is, from the broker that placed it (operator)."""
        path = _machine_path(app, machine_id, "placement")
        return PlacementExplanation.model_validate_json(await self._call("GET", path))

    async def create(
        self, app: str, req: CreateMachineRequest, strategy: str | None = None
    ) -> PublicMachine:
        """Placed by `strategy` (the broker's default, or one of `models.api.Strategy`, which the
        broker checks)."""
        params = {"strategy": strategy} if strategy else None
        path = _machine_path(app)
        return PublicMachine.model_validate_json(await self._call("POST", path, req, params))

    async def update(
        self, app: str, machine_id: str, req: UpdateMachineRequest, nonce: str | None = None
    ) -> PublicMachine:
        return await self._machine("POST", app, machine_id, body=req, nonce=nonce)

    async def start(self, app: str, machine_id: str, nonce: str | None = None) -> PublicMachine:
        return await self._machine("POST", app, machine_id, "start", nonce=nonce)

    async def stop(
        self, app: str, machine_id: str, req: StopRequest | None = None, nonce: str | None = None
    ) -> PublicMachine:
        body = req or StopRequest()
        return await self._machine("POST", app, machine_id, "stop", body, nonce=nonce)

    async def restart(self, app: str, machine_id: str, nonce: str | None = None) -> PublicMachine:
        return await self._machine("POST", app, machine_id, "restart", nonce=nonce)

    async def cordon(
        self, app: str, machine_id: str, nonce: str | None = None, cordoned: bool = True
    ) -> None:
        """Out of the proxy's rotation (or back in): the machine keeps running."""
        verb = "cordon" if cordoned else "uncordon"
        await self._call("POST", _machine_path(app, machine_id, verb), nonce=nonce)

    async def destroy(
        self, app: str, machine_id: str, nonce: str | None = None, force: bool = False
    ) -> PublicMachine:
        params = {"force": "true"} if force else None
        return await self._machine("DELETE", app, machine_id, params=params, nonce=nonce)

    async def wait(self, app: str, machine_id: str, state: MachineState, timeout: float) -> bool:
        """Whether the machine reached `state` within `timeout` seconds (long-polled, in
        slices the broker accepts)."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        path = _machine_path(app, machine_id, "wait")
        while True:
            left = deadline - loop.time()
            if left <= 0:
                return False
            piece = min(left, WAIT_MAX)
            params = {"state": state, "timeout": f"{piece:.3f}"}
            try:
                await self._call("GET", path, params=params, timeout=piece + 5)
            except MachinesApiError as exc:
                if exc.http_status != 408:
                    raise
            else:
                return True

    async def patch_metadata(
        self, app: str, machine_id: str, patch: MetadataPatch, nonce: str | None = None
    ) -> None:
        """Keys set and removed in place: same instance, no restart."""
        await self._call("PATCH", _machine_path(app, machine_id, "metadata"), patch, nonce=nonce)

    async def logs(self, app: str, machine_id: str, stream: str = "stdout") -> str:
        path = _machine_path(app, machine_id, "logs")
        payload = await self._call("GET", path, params={"stream": stream})
        return payload.decode(errors="replace")

    async def stream_logs(
        self, app: str, machine_id: str, stream: str = "stdout", follow: bool = True
    ) -> AsyncIterator[bytes]:
        """The machine's output as it arrives; with `follow`, for as long as it runs."""
        params = {"stream": stream, **({"follow": "true"} if follow else {})}
        url = self.base_url + _machine_path(app, machine_id, "logs")
        async with self.stream(MachinesApiError, url, params) as chunks:
            async for chunk in chunks:
                yield chunk

    # --- leases --------------------------------------------------------------------------

    async def lease(
        self, app: str, machine_id: str, req: CreateLeaseRequest, nonce: str | None = None
    ) -> Lease:
        """Take the machine's lease, or extend it with its nonce."""
        path = _machine_path(app, machine_id, "lease")
        return Lease.model_validate_json(await self._call("POST", path, req, nonce=nonce))

    async def get_lease(self, app: str, machine_id: str) -> Lease | None:
        path = _machine_path(app, machine_id, "lease")
        try:
            return Lease.model_validate_json(await self._call("GET", path))
        except MachinesApiError as exc:
            if exc.http_status == 404:
                return None
            raise

    async def release_lease(self, app: str, machine_id: str, nonce: str) -> None:
        await self._call("DELETE", _machine_path(app, machine_id, "lease"), nonce=nonce)

    # --- tokens --------------------------------------------------------------------------

    async def revoke_token(self, token_id: str) -> RevocationRow:
        return RevocationRow.model_validate_json(
            await self._call("DELETE", f"/v1/tokens/{token_id}")
        )

    # --- the catalog ---------------------------------------------------------------------

    async def catalog_status(self) -> dict[str, Any]:
        """Heads, lag and quarantined rows of the catalog node this client points at (a broker,
        or `souk catalog serve`, which needs no token)."""
        data: dict[str, Any] = orjson.loads(await self._call("GET", "/v1/catalog/status"))
        return data

    # --- volumes -------------------------------------------------------------------------

    async def volumes(self, app: str) -> list[Volume]:
        return _VOLUMES.validate_json(await self._call("GET", _volume_path(app)))

    async def volume(self, app: str, volume_id: str) -> Volume:
        return Volume.model_validate_json(await self._call("GET", _volume_path(app, volume_id)))

    async def create_volume(self, app: str, req: CreateVolumeRequest) -> Volume:
        return Volume.model_validate_json(await self._call("POST", _volume_path(app), req))

    async def extend_volume(
        self, app: str, volume_id: str, req: ExtendVolumeRequest
    ) -> ExtendVolumeResponse:
        path = _volume_path(app, volume_id, "extend")
        return ExtendVolumeResponse.model_validate_json(await self._call("PUT", path, req))

    async def destroy_volume(self, app: str, volume_id: str) -> Volume:
        path = _volume_path(app, volume_id)
        return Volume.model_validate_json(await self._call("DELETE", path))

    async def snapshots(self, app: str, volume_id: str) -> list[VolumeSnapshot]:
        path = _volume_path(app, volume_id, "snapshots")
        return _SNAPSHOTS.validate_json(await self._call("GET", path))

    async def snapshot_volume(self, app: str, volume_id: str) -> VolumeSnapshot:
        path = _volume_path(app, volume_id, "snapshots")
        return VolumeSnapshot.model_validate_json(await self._call("POST", path))
