"""Where the registry client connects and which redirects it follows, against small servers on
loopback: a blob may go to another origin (where big registries keep blobs) without the
registry's credentials, a manifest may not; nothing unlisted on a private address is asked,
be it the registry, a redirect's target or a token realm; a 404 is "not found" only from a
registry."""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import BaseTestServer, TestServer

from souk.worker.oci.auth import Credentials
from souk.worker.oci.egress import Egress, EgressRefused, public
from souk.worker.oci.registry import NotInRegistry, RegistryClient, RegistryConfig, Unreachable
from tests.support.images import TarBuilder, layer

Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]
BLOB = layer(TarBuilder().file("hello.txt", b"hello").bytes())


def serving(handler: Handler) -> TestServer:
    app = web.Application()
    app.router.add_route("*", "/{tail:.*}", handler)
    return TestServer(app, host="127.0.0.1")


def host_of(server: BaseTestServer) -> str:
    return f"{server.host}:{server.port}"


@pytest.mark.parametrize(
    ("address", "reached"),
    [
        ("93.184.215.14", True),
        ("2606:4700::1111", True),
        ("127.0.0.1", False),
        ("10.1.2.3", False),
        ("192.168.0.1", False),
        ("172.16.0.1", False),
        ("100.64.0.1", False),  # shared address space (carrier-grade NAT)
        ("169.254.169.254", False),  # link-local: the cloud's metadata service
        ("0.0.0.0", False),
        ("224.0.0.1", False),
        ("::1", False),
        ("fe80::1", False),
        ("fd00::1", False),
        ("::ffff:127.0.0.1", False),  # IPv4-mapped loopback
        ("64:ff9b::a9fe:a9fe", False),  # NAT64 of 169.254.169.254
        ("2002:7f00:1::", False),  # 6to4 of 127.0.0.1
        ("not-an-address", False),
    ],
)
def test_only_public_addresses_are_reached_unless_listed(address: str, reached: bool) -> None:
    assert public(address) is reached
    assert Egress([f"{address}:5000"]).allows(address, 5000, address)
    assert Egress([address]).allows(address, 443, address)  # a host listed without a port


async def test_a_blob_follows_a_redirect_elsewhere_without_the_registry_s_credentials(
    tmp_path: Path,
) -> None:
    seen: list[str | None] = []

    async def cdn(request: web.Request) -> web.Response:
        seen.append(request.headers.get("Authorization"))
        return web.Response(body=BLOB.blob)

    async with serving(cdn) as blobs:

        async def registry(request: web.Request) -> web.Response:
            if "Authorization" not in request.headers:
                raise web.HTTPUnauthorized(headers={"WWW-Authenticate": 'Basic realm="r"'})
            raise web.HTTPTemporaryRedirect(f"http://{host_of(blobs)}/blob?signed=1")

        async with serving(registry) as front:
            listed = frozenset({host_of(front), host_of(blobs)})  # plain http: both listed
            creds = {host_of(front): Credentials("me", "secret")}
            async with RegistryClient(RegistryConfig(insecure=listed, credentials=creds)) as c:
                ref = c.parse(f"{host_of(front)}/app:1")
                await c.download_blob(ref, BLOB.descriptor, tmp_path / "blob")
    assert (tmp_path / "blob").read_bytes() == BLOB.blob
    assert seen == [None]  # the registry's Basic credentials stayed with the registry


async def test_no_redirect_reaches_what_a_registry_could_not(tmp_path: Path) -> None:
    asked: list[str] = []

    async def internal(request: web.Request) -> web.Response:
        asked.append(request.path)
        return web.Response(body=BLOB.blob)

    async with serving(internal) as service:
        targets = [f"https://{host_of(service)}/blob", f"http://{host_of(service)}/blob"]

        async def registry(request: web.Request) -> web.Response:
            raise web.HTTPFound(targets[0])

        async with serving(registry) as front:
            only_front = RegistryConfig(insecure=frozenset({host_of(front)}))
            async with RegistryClient(only_front) as c:
                ref = c.parse(f"{host_of(front)}/app:1")
                with pytest.raises(EgressRefused, match="not a public address"):
                    await c.download_blob(ref, BLOB.descriptor, tmp_path / "blob")
                targets.pop(0)  # plain http to a registry not listed as insecure
                with pytest.raises(EgressRefused, match="another origin"):
                    await c.download_blob(ref, BLOB.descriptor, tmp_path / "blob")
            both = RegistryConfig(insecure=frozenset({host_of(front), host_of(service)}))
            async with RegistryClient(both) as c:
                ref = c.parse(f"{host_of(front)}/app:1")
                with pytest.raises(EgressRefused, match="another origin"):
                    await c.get_manifest(ref, "1")  # a manifest stays with its registry
    assert asked == []
    assert not (tmp_path / "blob").exists()


async def test_a_token_realm_on_a_private_address_is_not_asked() -> None:
    async def registry(request: web.Request) -> web.Response:
        realm = 'Bearer realm="http://169.254.169.254/token",service="r"'
        raise web.HTTPUnauthorized(headers={"WWW-Authenticate": realm})

    async with serving(registry) as front:
        config = RegistryConfig(insecure=frozenset({host_of(front)}))
        async with RegistryClient(config) as c:
            with pytest.raises(EgressRefused, match=r"169\.254\.169\.254"):
                await c.get_manifest(c.parse(f"{host_of(front)}/app:1"), "1")


async def test_a_404_is_not_found_only_from_a_registry() -> None:
    registry_shaped = True

    async def answer(request: web.Request) -> web.Response:
        if registry_shaped:
            body = {"errors": [{"code": "MANIFEST_UNKNOWN", "message": "manifest unknown"}]}
            return web.json_response(body, status=404)
        return web.Response(status=404, text="<h1>nothing here</h1>", content_type="text/html")

    async with serving(answer) as server:
        config = RegistryConfig(insecure=frozenset({host_of(server)}))
        async with RegistryClient(config) as c:
            ref = c.parse(f"{host_of(server)}/app:1")
            with pytest.raises(NotInRegistry):
                await c.get_manifest(ref, "1")
            registry_shaped = False
            with pytest.raises(Unreachable) as caught:
                await c.get_manifest(ref, "1")
            assert "nothing here" not in str(caught.value)
