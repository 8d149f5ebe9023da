"""The generated OpenAPI documents describe what the servers really send and answer."""

from __future__ import annotations

import re
from typing import Any

import aiohttp
import pytest
from aiohttp import web
from aiohttp.test_utils import make_mocked_request

from souk.models.duration import DURATION_SCHEMA
from souk.web import Permission, Route, error_middleware, openapi_document
from tests.web.conftest import Servers, raw, request_bytes

SLEEP: dict[str, Any] = {"app": "demo", "config": {"init": {"exec": ["sleep", "30"]}}}


async def document(url: str) -> dict[str, Any]:
    async with aiohttp.ClientSession() as http, http.get(f"{url}/openapi.json") as resp:
        assert resp.status == 200
        doc: dict[str, Any] = await resp.json()
        return doc


async def test_durations_are_documented_as_the_strings_that_are_sent(servers: Servers) -> None:
    doc = await document(servers.worker)
    stop = doc["components"]["schemas"]["StopConfig"]["properties"]["timeout"]
    assert stop["type"] == "string" and stop["pattern"] == DURATION_SCHEMA["pattern"]
    async with aiohttp.ClientSession() as http:
        async with http.post(f"{servers.worker}/v1/machines", json=SLEEP) as resp:
            machine = await resp.json()
        sent = machine["config"]["stop_config"]["timeout"]
        assert isinstance(sent, str) and re.fullmatch(stop["pattern"], sent), sent
        async with http.delete(f"{servers.worker}/v1/machines/{machine['id']}?force=true"):
            pass


async def test_guarded_routes_document_401_and_403_and_public_ones_do_not(
    servers: Servers,
) -> None:
    doc = await document(servers.broker)
    assert {"401", "403"} <= set(doc["paths"]["/v1/apps/{app}"]["get"]["responses"])

    async def handler(_: web.Request) -> web.Response:
        return web.Response()

    public = Route("GET", "/v1/ping", handler, "ping", permission=Permission.public())
    doc = openapi_document([public], "t", "0")
    assert not {"401", "403"} & set(doc["paths"]["/v1/ping"]["get"]["responses"])


@pytest.mark.parametrize("method", ["DELETE", "OPTIONS"])
async def test_the_token_paths_are_not_token_ids(servers: Servers, method: str) -> None:
    """DELETE /v1/tokens/{id} does not take /v1/tokens/current: the 405 lists what the document
    lists for that path."""
    auth = {"Authorization": f"Bearer {servers.token}"}
    got = await raw(servers.broker, request_bytes(method, "/v1/tokens/current", headers=auth))
    assert (got.status, got.reason) == (405, "method_not_allowed")
    assert got.headers["allow"] == "GET"
    doc = await document(servers.broker)
    assert set(doc["paths"]["/v1/tokens/current"]) == {"get"}


async def test_a_client_that_left_is_not_answered_a_500() -> None:
    async def gone(_: web.Request) -> web.StreamResponse:
        raise ConnectionResetError("Cannot write to closing transport")

    with pytest.raises(ConnectionResetError):
        await error_middleware(make_mocked_request("GET", "/v1/catalog/changes"), gone)
