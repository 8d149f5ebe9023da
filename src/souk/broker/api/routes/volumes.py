"""Routes of volumes, forwarded to the worker that holds each one."""

from __future__ import annotations

from souk.broker.api import (
    volumes,
)
from souk.broker.api.answers import fly_reply
from souk.broker.api.forward import (
    forward,
    forward_body,
    volume,
)
from souk.broker.api.routes.common import APP
from souk.models.volume import (
    CreateVolumeRequest,
    ExtendVolumeRequest,
    ExtendVolumeResponse,
    UpdateVolumeRequest,
    Volume,
    VolumeSnapshot,
)
from souk.web import Permission, Route, in_body

V = "/v1/apps/{app}/volumes"

ROUTES: list[Route] = [
    Route(
        "GET",
        V,
        volumes.list_volumes,
        "List an app's volumes",
        response=list[Volume],
        errors=(404,),
        permission=Permission.app_read(APP),
    ),
    Route(
        "POST",
        V,
        volumes.create_volume,
        "Create a volume on a worker with the disk (apart from the app's others with"
        " require_unique_zone), or restore a snapshot into a new one",
        CreateVolumeRequest,
        Volume,
        errors=(400, 404, 412),
        permission=Permission.app_deploy(APP, region=in_body("region")),
    ),
    Route(
        "GET",
        V + "/{id}",
        volumes.get_volume,
        "A volume",
        response=Volume,
        errors=(404, 503),
        permission=Permission.app_read(APP),
    ),
    Route(
        "PUT",
        V + "/{id}",
        forward_body(
            volume,
            UpdateVolumeRequest,
            lambda at, body: at.client.update_volume(*at.on, body),
            fly_reply,
        ),
        "Change a volume's snapshot retention",
        UpdateVolumeRequest,
        Volume,
        errors=(400, 404, 503),
        permission=Permission.app_deploy(APP),
    ),
    Route(
        "DELETE",
        V + "/{id}",
        forward(volume, lambda at: at.client.destroy_volume(*at.on), fly_reply),
        "Destroy a volume and its snapshots (409 while a machine mounts it)",
        response=Volume,
        errors=(404, 409, 503),
        permission=Permission.app_deploy(APP),
    ),
    Route(
        "PUT",
        V + "/{id}/extend",
        forward_body(
            volume,
            ExtendVolumeRequest,
            lambda at, body: at.client.extend_volume(*at.on, body),
            fly_reply,
        ),
        "Grow a volume, online",
        ExtendVolumeRequest,
        ExtendVolumeResponse,
        errors=(400, 404, 409, 412, 503),
        permission=Permission.app_deploy(APP),
    ),
    Route(
        "GET",
        V + "/{id}/snapshots",
        forward(volume, lambda at: at.client.snapshots(*at.on), fly_reply),
        "A volume's snapshots",
        response=list[VolumeSnapshot],
        errors=(404, 503),
        permission=Permission.app_read(APP),
    ),
    Route(
        "POST",
        V + "/{id}/snapshots",
        forward(volume, lambda at: at.client.snapshot_volume(*at.on), fly_reply),
        "Take a consistent snapshot (the file system frozen while it is copied)",
        response=VolumeSnapshot,
        errors=(404, 409, 503),
        permission=Permission.app_write(APP),
    ),
]
