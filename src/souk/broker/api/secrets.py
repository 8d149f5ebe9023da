"""App secrets (`/v1/apps/{app}/secrets`, Fly's shapes): set and unset by the broker that hosts
the app registry, their one writer (any other forwards the write there, values and all, over
its TLS link); listed by name and digest, never by value (see `souk.broker.secrets`)."""

from __future__ import annotations

from aiohttp import web

from souk.broker.api.apps import forward_registry
from souk.broker.api.errors import refusal
from souk.broker.api.params import flag
from souk.broker.registry import AppNotFound, MetadataRefused, now_iso
from souk.broker.secrets import SecretRefused, open_secrets, seal_secret
from souk.broker.state import OPENED_APPS, Broker, broker_of, sealer_of
from souk.models.catalog import AppRow
from souk.models.secrets import (
    AppSecrets,
    AppSecretsUpdateRequest,
    AppSecretsUpdateResp,
    DeleteAppSecretResponse,
    SetAppSecretRequest,
    SetAppSecretResponse,
    shown,
)
from souk.sealing import Sealer
from souk.web import ApiError, read_model, reply


def _refused(exc: SecretRefused | MetadataRefused) -> ApiError:
    return refusal(exc)


def _no_values(request: web.Request) -> None:
    """Fly can show values to its own tooling; souk shows them to no caller at all."""
    if flag(request, "show_secrets"):
        raise ApiError(
            403,
            "secrets_write_only",
            "show_secrets: souk never returns a secret's value; only machines of the app see it",
        )


def _row(request: web.Request, name: str) -> AppRow:
    b = broker_of(request)
    if b.registry is not None:
        row = b.registry.get(name)
        if row is None:
            raise ApiError(404, "not_found", f"app {name} not found")
        return row
    return b.require_app(name)


def _names(request: web.Request) -> tuple[str, str]:
    return request.match_info["app"], request.match_info["secret_name"]


def _listing(row: AppRow) -> AppSecrets:
    return AppSecrets(secrets=[shown(n, r) for n, r in sorted(row.secrets.items())])


async def list_secrets(request: web.Request) -> web.Response:
    _no_values(request)
    b, name = broker_of(request), request.match_info["app"]
    if b.registry is None and b.registry_url:  # read from the writer: a set is seen at once
        return await forward_registry(request, "GET", f"/v1/apps/{name}/secrets")
    return reply(_listing(_row(request, name)))


async def get_secret(request: web.Request) -> web.Response:
    _no_values(request)
    b, name, secret = (
        broker_of(request),
        request.match_info["app"],
        request.match_info["secret_name"],
    )
    if b.registry is None and b.registry_url:
        return await forward_registry(request, "GET", f"/v1/apps/{name}/secrets/{secret}")
    record = _row(request, name).secrets.get(secret)
    if record is None:
        raise ApiError(404, "not_found", f"app {name} has no secret {secret}")
    return reply(shown(secret, record))


def _patch(b: Broker, sealer: Sealer, app: str, values: dict[str, str | None]) -> AppRow:
    """Seal and store a patch on the registry; the app after it."""
    assert b.registry is not None
    stamp = now_iso()
    try:
        sealed = {
            k: seal_secret(sealer, app, k, v, stamp) for k, v in values.items() if v is not None
        }
        gone = [k for k, v in values.items() if v is None]
        return b.registry.patch_secrets(app, sealed, gone)
    except AppNotFound:
        raise ApiError(404, "not_found", f"app {app} not found") from None
    except (SecretRefused, MetadataRefused) as exc:
        raise _refused(exc) from None


async def update_secrets(request: web.Request) -> web.Response:
    b, name = broker_of(request), request.match_info["app"]
    body = await read_model(request, AppSecretsUpdateRequest)
    if b.registry is None:
        return await forward_registry(
            request, "POST", f"/v1/apps/{name}/secrets", body.model_dump()
        )
    row = _patch(b, sealer_of(request), name, body.values)
    listing = _listing(row).secrets
    version = row.secrets_version
    return reply(AppSecretsUpdateResp(secrets=listing, version=version, Version=version))


async def set_secret(request: web.Request) -> web.Response:
    b, name, secret = (
        broker_of(request),
        request.match_info["app"],
        request.match_info["secret_name"],
    )
    body = await read_model(request, SetAppSecretRequest)
    if b.registry is None:
        path = f"/v1/apps/{name}/secrets/{secret}"
        return await forward_registry(request, "POST", path, body.model_dump())
    row = _patch(b, sealer_of(request), name, {secret: body.value})
    view = shown(secret, row.secrets[secret])
    version = row.secrets_version
    answer = SetAppSecretResponse(**view.model_dump(), version=version, Version=version)
    return reply(answer, status=201)


async def delete_secret(request: web.Request) -> web.Response:
    b, name, secret = (
        broker_of(request),
        request.match_info["app"],
        request.match_info["secret_name"],
    )
    if b.registry is None:
        return await forward_registry(request, "DELETE", f"/v1/apps/{name}/secrets/{secret}")
    before = _row(request, name)
    if secret not in before.secrets:
        raise ApiError(404, "not_found", f"app {name} has no secret {secret}")
    row = _patch(b, sealer_of(request), name, {secret: None})
    version = row.secrets_version
    return reply(DeleteAppSecretResponse(version=version, Version=version))


def machine_secrets(
    request: web.Request, app: str, skip: bool | None, row: AppRow | None = None
) -> dict[str, str]:
    """The app's secrets, opened, for a machine being created or updated (none if the client
    asked to skip them); from `row` if the caller has it, else as the fleet reads apps. Opened
    once per version of the app's row (`Broker.opened`), not for every create: each secret is
    a decryption."""
    if skip:
        return {}
    b = broker_of(request)
    if row is None:
        row = b.fleet.app(app)
    if row is None:
        raise ApiError(404, "not_found", f"app {app} not found")
    held = b.opened.get(app)
    if held is not None and held[0] is row:
        return dict(held[1])
    try:
        opened = open_secrets(sealer_of(request), row)
    except SecretRefused as exc:
        raise _refused(exc) from None
    if len(b.opened) >= OPENED_APPS:
        b.opened.clear()
    b.opened[app] = (row, opened)
    return dict(opened)
