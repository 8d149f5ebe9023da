"""Routes of apps, their metadata and their secrets."""

from __future__ import annotations

from souk.broker.api import (
    apps,
    secrets,
)
from souk.broker.api.routes.common import APP
from souk.models.api import (
    App,
    CreateAppRequest,
    ListAppsResponse,
)
from souk.models.machine import MetadataChange
from souk.models.secrets import (
    AppSecret,
    AppSecrets,
    AppSecretsUpdateRequest,
    AppSecretsUpdateResp,
    DeleteAppSecretResponse,
    SetAppSecretRequest,
    SetAppSecretResponse,
)
from souk.web import Permission, Route, in_body

SECRETS = "/v1/apps/{app}/secrets"
SECRET = SECRETS + "/{secret_name}"

ROUTES: list[Route] = [
    Route(
        "GET",
        "/v1/apps",
        apps.list_apps,
        "List apps",
        response=ListAppsResponse,
        query={"org_slug": "only this organisation's"},
        permission=Permission.app_read(own_rows=True),
    ),
    Route(
        "POST",
        "/v1/apps",
        apps.create_app,
        "Create an app",
        CreateAppRequest,
        App,
        201,
        errors=(403, 409, 503),
        permission=Permission.app_deploy(app=in_body("name", "app_name")),
    ),
    Route(
        "GET",
        "/v1/apps/{app}",
        apps.get_app,
        "An app",
        response=App,
        errors=(404,),
        permission=Permission.app_read(APP),
    ),
    Route(
        "DELETE",
        "/v1/apps/{app}",
        apps.delete_app,
        "Delete an app with no machines",
        status=202,
        errors=(404, 409),
        permission=Permission.app_deploy(APP),
    ),
    Route(
        "GET",
        "/v1/apps/{app}/metadata",
        apps.get_app_metadata,
        "The app's metadata (souk extension)",
        response=dict[str, str],
        errors=(404, 503),
        permission=Permission.app_read(APP),
    ),
    Route(
        "PATCH",
        "/v1/apps/{app}/metadata",
        apps.patch_app_metadata,
        "Delete, then set, app metadata keys in one step; answers with the result",
        MetadataChange,
        dict[str, str],
        errors=(400, 404, 413, 503),
        permission=Permission.app_deploy(APP),
    ),
    # Secrets: names and digests to readers; setting one takes what a deploy takes, since
    # every machine of the app gets it.
    Route(
        "GET",
        SECRETS,
        secrets.list_secrets,
        "The app's secrets: names and digests, never values",
        response=AppSecrets,
        errors=(403, 404, 503),
        query={"show_secrets": "refused (403): souk never returns a value"},
        permission=Permission.app_read(APP),
    ),
    Route(
        "POST",
        SECRETS,
        secrets.update_secrets,
        "Set several secrets (a null value unsets one), sealed in one step",
        AppSecretsUpdateRequest,
        AppSecretsUpdateResp,
        errors=(400, 404, 413, 503),
        permission=Permission.app_deploy(APP),
    ),
    Route(
        "GET",
        SECRET,
        secrets.get_secret,
        "One secret: its name and digest",
        response=AppSecret,
        errors=(403, 404, 503),
        query={"show_secrets": "refused (403): souk never returns a value"},
        permission=Permission.app_read(APP),
    ),
    Route(
        "POST",
        SECRET,
        secrets.set_secret,
        "Set one secret",
        SetAppSecretRequest,
        SetAppSecretResponse,
        201,
        errors=(400, 404, 413, 503),
        permission=Permission.app_deploy(APP),
    ),
    Route(
        "DELETE",
        SECRET,
        secrets.delete_secret,
        "Unset one secret",
        response=DeleteAppSecretResponse,
        errors=(404, 503),
        permission=Permission.app_deploy(APP),
    ),
]
