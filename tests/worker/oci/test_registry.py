"""The registry client against a real registry: manifests, indexes, auth, verified blobs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from aiohttp import web
from aiohttp.test_utils import TestServer

from souk.worker.oci.auth import AuthError, Credentials
from souk.worker.oci.egress import EgressRefused
from souk.worker.oci.manifest import (
    OCI_LAYER,
    OCI_MANIFEST,
    Descriptor,
    ManifestError,
    Platform,
    host_platform,
)
from souk.worker.oci.reference import ImageRef
from souk.worker.oci.registry import (
    DigestMismatch,
    NotInRegistry,
    RegistryClient,
    RegistryConfig,
    Restarted,
    sha256_digest,
)
from tests.support.images import ImageSpec, Layer, TarBuilder, layer, push_image, push_index
from tests.support.registry import Registry, push


def small_layer(text: str) -> Layer:
    return layer(TarBuilder().file("hello.txt", text.encode()).bytes())


async def test_resolve_by_tag_and_by_digest(registry: Registry, client: RegistryClient) -> None:
    spec = ImageSpec([small_layer("one")], cmd=["/bin/true"])
    pushed = await push(client, registry, "app:v1", spec)

    by_tag = await client.resolve(client.parse(f"{registry.host}/app:v1"))
    assert by_tag.digest == pushed.digest
    assert by_tag.media_type == OCI_MANIFEST
    assert [x.digest for x in by_tag.manifest.layers] == [spec.layers[0].descriptor.digest]

    by_digest = await client.resolve(client.parse(f"{registry.host}/app@{pushed.digest}"))
    assert by_digest.raw == by_tag.raw


async def test_index_picks_the_host_platform(registry: Registry, client: RegistryClient) -> None:
    here = host_platform()
    other = Platform("linux", "s390x" if here.architecture != "s390x" else "amd64")
    mine = await push_image(
        client, registry.ref("multi"), ImageSpec([small_layer("mine")], platform=here)
    )
    theirs = await push_image(
        client, registry.ref("multi"), ImageSpec([small_layer("theirs")], platform=other)
    )
    await push_index(client, registry.ref("multi:latest"), [theirs, mine])

    resolved = await client.resolve(client.parse(f"{registry.host}/multi"))
    assert resolved.digest == mine.digest

    await push_index(client, registry.ref("multi:foreign"), [theirs])
    with pytest.raises(ManifestError, match="no manifest for linux/"):
        await client.resolve(client.parse(f"{registry.host}/multi:foreign"))


async def test_missing_image(registry: Registry, client: RegistryClient) -> None:
    with pytest.raises(NotInRegistry):
        await client.resolve(client.parse(f"{registry.host}/nothing:here"))


async def test_plain_http_only_for_insecure_registries(registry: Registry) -> None:
    private = frozenset({registry.host})  # reached on loopback, but over https only
    async with registry.client(insecure=frozenset(), private=private) as strict:
        with pytest.raises(Exception, match=r"(?i)ssl|https|record|connect"):
            await strict.resolve(strict.parse(f"{registry.host}/app:v1"))
    async with registry.client(insecure=frozenset()) as unlisted:  # not even reached
        with pytest.raises(EgressRefused, match="not a public address nor a listed registry"):
            await unlisted.resolve(unlisted.parse(f"{registry.host}/app:v1"))
    assert registry.requests() == []  # nothing was ever sent in the clear


async def test_blob_download_verifies_digest(
    registry: Registry, client: RegistryClient, tmp_path: Path
) -> None:
    good, bad = small_layer("good"), small_layer("bad")
    ref = registry.ref("blobs")
    await client.upload_blob(ref, good.blob)
    await client.upload_blob(ref, bad.blob)
    out = tmp_path / "out"
    out.mkdir()
    await client.download_blob(ref, good.descriptor, out / "good")
    assert (out / "good").read_bytes() == good.blob

    registry.corrupt(bad.descriptor.digest)
    with pytest.raises(DigestMismatch):
        await client.download_blob(ref, bad.descriptor, out / "bad")
    assert sorted(p.name for p in out.iterdir()) == ["good"]


async def test_blob_download_resumes_with_a_range(
    registry: Registry, client: RegistryClient, tmp_path: Path
) -> None:
    big = layer(TarBuilder().file("data", bytes(range(256)) * 8192).bytes(), compress=False)
    ref = registry.ref("resume")
    await client.upload_blob(ref, big.blob)
    dest = tmp_path / "blob"
    half = len(big.blob) // 2
    Path(f"{dest}.partial").write_bytes(big.blob[:half])

    await client.download_blob(ref, big.descriptor, dest)
    assert dest.read_bytes() == big.blob
    assert [r.status for r in registry.blob_gets(big.descriptor.digest)] == [206]


async def test_corrupt_partial_is_rejected(
    registry: Registry, client: RegistryClient, tmp_path: Path
) -> None:
    data = small_layer("resume me")
    ref = registry.ref("resume")
    await client.upload_blob(ref, data.blob)
    dest = tmp_path / "blob"
    Path(f"{dest}.partial").write_bytes(b"\0" * 10)  # wrong bytes: the resumed whole won't hash
    with pytest.raises(DigestMismatch):
        await client.download_blob(ref, data.descriptor, dest)
    assert not dest.exists() and not Path(f"{dest}.partial").exists()
    await client.download_blob(ref, data.descriptor, dest)  # a clean retry succeeds
    assert dest.read_bytes() == data.blob


async def test_basic_auth(basic_registry: Registry) -> None:
    async with basic_registry.client() as c:
        pushed = await push_image(
            c, basic_registry.ref("private:v1"), ImageSpec([small_layer("secret")])
        )
        resolved = await c.resolve(c.parse(f"{basic_registry.host}/private:v1"))
        assert resolved.digest == pushed.digest
    async with basic_registry.client(credentials={}) as anonymous:
        with pytest.raises(AuthError, match="credentials"):
            await anonymous.resolve(anonymous.parse(f"{basic_registry.host}/private:v1"))
    wrong = {basic_registry.host: Credentials("alice", "nope")}
    async with basic_registry.client(credentials=wrong) as bad:
        with pytest.raises(AuthError, match="refused"):
            await bad.resolve(bad.parse(f"{basic_registry.host}/private:v1"))


async def test_manifest_digest_is_checked(registry: Registry, client: RegistryClient) -> None:
    pushed = await push(client, registry, "app:v1", ImageSpec([small_layer("x")]))
    ref = client.parse(f"{registry.host}/app@{pushed.digest}")
    media_type, raw, digest = await client.get_manifest(ref, pushed.digest)
    assert digest == pushed.digest and json.loads(raw)["mediaType"] == media_type
    assert isinstance(ref, ImageRef) and ref.digest == pushed.digest


async def test_a_download_the_registry_restarts_says_so_to_its_reader(tmp_path: Path) -> None:
    """A registry that breaks a blob off midway, then ignores the Range that resumes it, sends
    the blob from its first byte again: a download with a `progress` reader raises `Restarted`
    (its reader saw the first bytes already); one without just starts over."""
    blob = os.urandom(300_000)
    descriptor = Descriptor(OCI_LAYER, sha256_digest(blob), len(blob))
    sent: list[str | None] = []

    async def serve(request: web.Request) -> web.StreamResponse:
        sent.append(request.headers.get("Range"))
        resp = web.StreamResponse(status=200)
        resp.content_length = len(blob)
        await resp.prepare(request)
        if len(sent) == 1:  # the first answer breaks off
            await resp.write(blob[:100_000])
            assert request.transport is not None
            request.transport.close()
            return resp
        await resp.write(blob)
        return resp

    app = web.Application()
    app.router.add_get("/v2/{name}/blobs/{digest}", serve)
    async with TestServer(app) as server:
        host = f"{server.host}:{server.port}"
        config = RegistryConfig(insecure=frozenset([host]))
        async with RegistryClient(config) as client:
            ref = client.parse(f"{host}/restarts:1")
            told: list[int] = []
            with pytest.raises(Restarted):
                await client.download_blob(
                    ref, descriptor, tmp_path / "blob", lambda _, n: told.append(n)
                )
            assert told and told[-1] <= 100_000 and sent[1] is not None  # it asked for the rest
            await client.download_blob(ref, descriptor, tmp_path / "blob")
    assert (tmp_path / "blob").read_bytes() == blob
