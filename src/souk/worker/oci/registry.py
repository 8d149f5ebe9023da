"""A client for the OCI distribution API (registry HTTP API v2) on aiohttp: manifests, verified
and resumable blob downloads, and the upload half that test images and benchmarks push with."""

from __future__ import annotations

import asyncio
import hashlib
import os
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import urljoin

import aiohttp

from souk.worker.oci.auth import AuthError, Challenge, Credentials, Token, fetch_token
from souk.worker.oci.auth import parse_challenge as parse_challenge
from souk.worker.oci.manifest import (
    ACCEPT,
    INDEXES,
    Descriptor,
    Manifest,
    Platform,
    choose_platform,
    host_platform,
    media_type_of,
    parse_manifest,
)
from souk.worker.oci.reference import ImageRef, parse_reference

MAX_MANIFEST = 4 << 20
CHUNK = 1 << 20
# What a download hands on at a time, to the file and to the layer's unpacking as it arrives: at a
# mebibyte, a layer of one (most small images' largest) was unpacked only once all of it was in.
STREAM_CHUNK = 1 << 18


class RegistryError(Exception):
    """The registry failed us: an unexpected status, or a broken connection after retries."""


class NotFound(RegistryError):
    """No such repository, tag, manifest or blob."""


class DigestMismatch(RegistryError):
    """Content did not hash to the digest that named it; nothing of it is kept."""


class Restarted(RegistryError):
    """A download began again from its first byte (the registry ignored a Range) after its
    progress had told of bytes already there: what read them must start over too."""


Progress = Callable[[Path, int], None]


@dataclass(frozen=True)
class RegistryConfig:
    insecure: frozenset[str] = frozenset()  # registries (host[:port]) reached over plain http
    credentials: Mapping[str, Credentials] = field(default_factory=dict)
    default_registry: str | None = None
    platform: Platform = field(default_factory=host_platform)
    retries: int = 3  # attempts per blob download, each resuming where the last stopped


@dataclass(frozen=True)
class Resolved:
    """An image reference pinned to the digest of its platform manifest."""

    ref: ImageRef
    digest: str
    manifest: Manifest
    raw: bytes
    media_type: str


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


class RegistryClient:
    def __init__(
        self, config: RegistryConfig | None = None, session: aiohttp.ClientSession | None = None
    ) -> None:
        self.config = config or RegistryConfig()
        self._session = session
        self._own_session = session is None
        self._tokens: dict[tuple[str, str], Token] = {}
        self._basic: set[str] = set()  # registries that asked for Basic auth

    async def __aenter__(self) -> RegistryClient:
        return self

    async def __aexit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.close()

    async def close(self) -> None:
        if self._session is not None and self._own_session:
            await self._session.close()
        self._session = None

    @property
    def session(self) -> aiohttp.ClientSession:
        if self._session is None:
            timeout = aiohttp.ClientTimeout(total=None, sock_connect=10, sock_read=60)
            self._session = aiohttp.ClientSession(timeout=timeout)
            self._own_session = True
        return self._session

    def parse(self, text: str) -> ImageRef:
        return parse_reference(text, self.config.default_registry)

    # -- transport -------------------------------------------------------------------------

    def _base(self, registry: str) -> str:
        scheme = "http" if registry in self.config.insecure else "https"
        return f"{scheme}://{registry}/v2/"

    def _authorization(self, registry: str, scope: str) -> str | None:
        token = self._tokens.get((registry, scope))
        if token and token.expires > time.monotonic():
            return f"Bearer {token.value}"
        creds = self.config.credentials.get(registry)
        if registry in self._basic and creds:
            return creds.basic()
        return None

    async def _authenticate(self, registry: str, scope: str, challenge: Challenge) -> None:
        creds = self.config.credentials.get(registry)
        if challenge.scheme == "basic":
            if not creds:
                raise AuthError(f"{registry} wants credentials and none are configured")
            self._basic.add(registry)
        elif challenge.scheme == "bearer":
            allow_http = registry in self.config.insecure
            token = await fetch_token(self.session, challenge, scope, creds, allow_http)
            self._tokens[(registry, scope)] = token
        else:
            raise AuthError(f"{registry} asks for unsupported auth scheme {challenge.scheme!r}")

    async def _send(
        self,
        method: str,
        ref: ImageRef,
        path: str,
        actions: str = "pull",
        headers: Mapping[str, str] | None = None,
        data: bytes | None = None,
    ) -> aiohttp.ClientResponse:
        """One request, authenticating once on a 401. The caller releases the response."""
        url = urljoin(self._base(ref.registry), path)
        scope = f"repository:{ref.repository}:{actions}"
        for attempt in range(2):
            sent = dict(headers or {})
            auth = self._authorization(ref.registry, scope)
            if auth:
                sent["Authorization"] = auth
            resp = await self.session.request(method, url, headers=sent, data=data)
            if resp.status != 401:
                return resp
            header = resp.headers.get("WWW-Authenticate", "")
            resp.release()
            if attempt or not header:
                raise AuthError(f"{ref.registry} refused {method} {path} ({resp.status})")
            await self._authenticate(ref.registry, scope, parse_challenge(header))
        raise AssertionError("unreachable")

    @staticmethod
    async def _fail(resp: aiohttp.ClientResponse, what: str) -> RegistryError:
        text = (await resp.text())[:300]
        kind = NotFound if resp.status == 404 else RegistryError
        return kind(f"{what}: {resp.status} {text}")

    # -- manifests -------------------------------------------------------------------------

    async def get_manifest(self, ref: ImageRef, reference: str) -> tuple[str, bytes, str]:
        """(media type, bytes, digest) of one manifest or index, its digest verified."""
        path = f"{ref.repository}/manifests/{reference}"
        async with await self._send("GET", ref, path, headers={"Accept": ACCEPT}) as resp:
            if resp.status != 200:
                raise await self._fail(resp, f"manifest {ref.repository}:{reference}")
            data = await resp.content.read(MAX_MANIFEST + 1)
            if len(data) > MAX_MANIFEST:
                raise RegistryError(f"manifest {reference} is larger than {MAX_MANIFEST} bytes")
            digest = sha256_digest(data)
            claimed = resp.headers.get("Docker-Content-Digest")
            expected = reference if reference.startswith("sha256:") else claimed
            if expected and expected != digest:
                raise DigestMismatch(f"manifest {reference} hashes to {digest}, not {expected}")
            return media_type_of(data, resp.headers.get("Content-Type")), data, digest

    async def resolve(self, ref: ImageRef) -> Resolved:
        """Fetch the image manifest for this reference, through an index if it names one."""
        media_type, data, digest = await self.get_manifest(ref, ref.reference)
        if media_type in INDEXES:
            entry = choose_platform(data, self.config.platform)
            media_type, data, digest = await self.get_manifest(ref, entry.digest)
            if media_type in INDEXES:
                raise RegistryError(f"{ref}: an index inside an index is not supported")
        return Resolved(ref, digest, parse_manifest(data), data, media_type)

    # -- blobs -----------------------------------------------------------------------------

    async def download_blob(
        self, ref: ImageRef, blob: Descriptor, dest: Path, progress: Progress | None = None
    ) -> None:
        """Download into `dest`, resuming a `.partial` left by an earlier attempt; `dest` only
        ever appears holding bytes that hash to `blob.digest`. `progress(partial, n)`: the
        first `n` bytes are in the file `partial` now (read them as they come, to unpack while
        the rest arrives; they are verified only once this returns). `Restarted` if bytes it
        told of must be read again."""
        partial = dest.with_name(dest.name + ".partial")
        told = [0]

        def tell(size: int) -> None:
            if progress is not None and size > told[0]:
                told[0] = size
                progress(partial, size)

        last: Exception | None = None
        for _ in range(max(1, self.config.retries)):
            try:
                await self._download_once(ref, blob, partial, tell, told[0])
                break
            except (TimeoutError, aiohttp.ClientError) as e:
                last = e
        else:
            raise RegistryError(f"blob {blob.digest}: {last}")
        hasher = await asyncio.to_thread(_hash_file, partial)
        digest = "sha256:" + hasher.hexdigest()
        if digest != blob.digest:
            partial.unlink(missing_ok=True)
            raise DigestMismatch(f"blob hashes to {digest}, not {blob.digest}")
        os.replace(partial, dest)

    async def _download_once(
        self,
        ref: ImageRef,
        blob: Descriptor,
        partial: Path,
        tell: Callable[[int], None],
        told: int,
    ) -> None:
        have = partial.stat().st_size if partial.exists() else 0
        if have >= blob.size:
            # Complete already, or longer than it should be (then certainly wrong): start over
            # unless exactly complete, which the caller verifies.
            if have == blob.size:
                tell(have)
                return
            if told:
                raise Restarted(f"blob {blob.digest}: {have} bytes, more than {blob.size}")
            partial.unlink()
            have = 0
        headers = {"Range": f"bytes={have}-"} if have else {}
        path = f"{ref.repository}/blobs/{blob.digest}"
        async with await self._send("GET", ref, path, headers=headers) as resp:
            if resp.status == 200:
                if told:
                    raise Restarted(f"blob {blob.digest}: the registry sent it from the start")
                have, mode = 0, "wb"
            elif resp.status == 206 and have:
                mode = "ab"
            else:
                raise await self._fail(resp, f"blob {blob.digest}")
            with open(partial, mode) as out:
                tell(have)
                async for chunk in resp.content.iter_chunked(STREAM_CHUNK):
                    have += len(chunk)
                    if have > blob.size:
                        out.close()
                        partial.unlink()
                        raise DigestMismatch(f"blob {blob.digest} is longer than {blob.size}")
                    out.write(chunk)
                    out.flush()
                    tell(have)

    async def blob_exists(self, ref: ImageRef, digest: str) -> bool:
        async with await self._send("HEAD", ref, f"{ref.repository}/blobs/{digest}") as resp:
            return resp.status == 200

    async def upload_blob(self, ref: ImageRef, data: bytes) -> str:
        """Push one blob (a monolithic POST then PUT) unless the registry has it; its digest."""
        digest = sha256_digest(data)
        if await self.blob_exists(ref, digest):
            return digest
        path = f"{ref.repository}/blobs/uploads/"
        async with await self._send("POST", ref, path, "pull,push") as resp:
            if resp.status != 202 or "Location" not in resp.headers:
                raise await self._fail(resp, f"starting upload of {digest}")
            location = resp.headers["Location"]
        sep = "&" if "?" in location else "?"
        url = urljoin(self._base(ref.registry), location) + f"{sep}digest={digest}"
        headers = {"Content-Type": "application/octet-stream"}
        async with await self._send("PUT", ref, url, "pull,push", headers, data) as resp:
            if resp.status != 201:
                raise await self._fail(resp, f"uploading {digest}")
        return digest

    async def put_manifest(
        self, ref: ImageRef, reference: str, media_type: str, data: bytes
    ) -> str:
        path = f"{ref.repository}/manifests/{reference}"
        headers = {"Content-Type": media_type}
        async with await self._send("PUT", ref, path, "pull,push", headers, data) as resp:
            if resp.status != 201:
                raise await self._fail(resp, f"pushing manifest {reference}")
        return sha256_digest(data)


def _hash_file(path: Path) -> hashlib._Hash:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            hasher.update(block)
    return hasher
