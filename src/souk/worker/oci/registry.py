"""A client for the OCI distribution API (registry HTTP API v2) on aiohttp: manifests, verified
and resumable blob downloads, and the upload half that test images and benchmarks push with.

What it reaches is bounded (docs/oci.md#what-the-worker-connects-to): every connection goes to a
public address or a listed registry (`egress.py`); a redirect is followed within the registry's
own origin, and to another only for a blob download, over https to a public address (where the
big registries keep their blobs), never with the registry's credentials; and an error names the
status a registry answered, never what it said (a body could be another service's secrets).
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import logging
import os
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from urllib.parse import urljoin

import aiohttp
from yarl import URL

from souk.worker.oci.auth import AuthError, Challenge, Credentials, Token, fetch_token
from souk.worker.oci.auth import parse_challenge as parse_challenge
from souk.worker.oci.egress import Egress, EgressRefused, GuardedResolver
from souk.worker.oci.manifest import (
    ACCEPT,
    INDEXES,
    Descriptor,
    Manifest,
    ManifestError,
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
REDIRECTS = frozenset({301, 302, 303, 307, 308})
MAX_REDIRECTS = 5
ERROR_PEEK = 64 << 10  # of an error answer, read to tell a registry's 404 from anything else's

log = logging.getLogger("souk.worker.oci")


class RegistryError(Exception):
    """The registry failed us: an unexpected status, or a broken connection after retries."""


class NotInRegistry(RegistryError):
    """No such repository, tag, manifest or blob."""


class DigestMismatch(RegistryError):
    """Content did not hash to the digest that named it; nothing of it is kept."""


class Unreachable(RegistryError):
    """Nothing usable came back: the connection failed or was refused, the answer was not a
    registry's, a redirect went where the client does not follow. One message whatever the
    cause, so that a client cannot tell a closed port from a TLS one or another service
    (`fetching`); the cause goes to the worker's log."""


@contextlib.contextmanager
def fetching(what: object) -> Iterator[None]:
    """Around a fetch of `what` (an image reference): every failure to get it but a
    registry's "not found" or content that does not match its digest becomes the one
    `Unreachable` error, its cause logged."""
    try:
        yield
    except (NotInRegistry, DigestMismatch):  # the registry's own answer: no other service gives one
        raise
    except (RegistryError, AuthError, ManifestError, aiohttp.ClientError, TimeoutError) as exc:
        log.info("could not fetch %s: %s: %s", what, type(exc).__name__, exc)
        raise Unreachable(f"could not fetch {what} from its registry") from None


class Restarted(RegistryError):
    """A download began again from its first byte (the registry ignored a Range) after its
    progress had told of bytes already there: what read them must start over too."""


FetchProgress = Callable[[Path, int], None]


@dataclass(frozen=True)
class RegistryConfig:
    insecure: frozenset[str] = frozenset()  # registries (host[:port]) reached over plain http
    private: frozenset[str] = frozenset()  # registries (host[:port]) on private addresses
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
        # A listed registry is reached wherever it is (loopback, a private network); every
        # other host only on public addresses.
        self.egress = Egress(self.config.insecure | self.config.private)

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
            connector = aiohttp.TCPConnector(resolver=GuardedResolver(self.egress))
            self._session = aiohttp.ClientSession(timeout=timeout, connector=connector)
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
            token = await fetch_token(
                self.session, challenge, scope, creds, allow_http, self.egress.check
            )
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
        elsewhere: bool = False,
    ) -> aiohttp.ClientResponse:
        """One request, authenticating once on a 401. The caller releases the response.
        Redirects are followed within the registry's origin; `elsewhere` (a blob's download)
        also to other origins, as `_redirected` allows."""
        url = urljoin(self._base(ref.registry), path)
        scope = f"repository:{ref.repository}:{actions}"
        for attempt in range(2):
            sent = dict(headers or {})
            auth = self._authorization(ref.registry, scope)
            if auth:
                sent["Authorization"] = auth
            resp = await self._request(method, URL(url, encoded=True), sent, data, elsewhere)
            if resp.status != 401:
                return resp
            header = resp.headers.get("WWW-Authenticate", "")
            resp.release()
            if attempt or not header:
                raise AuthError(f"{ref.registry} refused {method} {path} ({resp.status})")
            await self._authenticate(ref.registry, scope, parse_challenge(header))
        raise AssertionError("unreachable")

    async def _request(
        self,
        method: str,
        url: URL,
        headers: dict[str, str],
        data: bytes | None,
        elsewhere: bool,
    ) -> aiohttp.ClientResponse:
        """`method` on `url`, through the redirects `_redirected` allows: never one aiohttp
        follows by itself, which would go anywhere with the same headers."""
        for _ in range(MAX_REDIRECTS + 1):
            self.egress.check(url)
            resp = await self.session.request(
                method, url, headers=headers, data=data, allow_redirects=False
            )
            if resp.status not in REDIRECTS or "Location" not in resp.headers:
                return resp
            target = url.join(URL(resp.headers["Location"]))
            resp.release()
            headers = self._redirected(url, target, headers, elsewhere)
            url = target
        raise EgressRefused(f"more than {MAX_REDIRECTS} redirects")

    def _redirected(
        self, origin: URL, target: URL, headers: dict[str, str], elsewhere: bool
    ) -> dict[str, str]:
        """The headers to send `target`, or `EgressRefused` where the client does not follow:
        another origin, unless `elsewhere` and over https (plain http only to a registry
        listed as insecure). The registry's credentials stay with the registry."""
        if (target.scheme, target.host, target.port) == (origin.scheme, origin.host, origin.port):
            return headers
        listed_http = target.scheme == "http" and target.raw_authority in self.config.insecure
        if not elsewhere or (target.scheme != "https" and not listed_http):
            raise EgressRefused(f"a redirect from {origin.raw_authority} to another origin")
        return {k: v for k, v in headers.items() if k.lower() != "authorization"}

    @staticmethod
    async def _fail(resp: aiohttp.ClientResponse, what: str) -> RegistryError:
        """An unexpected answer, by its status alone: `NotInRegistry` only for a 404 that is a
        registry's (its API version header, or its JSON `errors`), anything else is no
        registry of ours to believe (`Unreachable`)."""
        if resp.status == 404 and await _registry_answer(resp):
            return NotInRegistry(f"{what}: not found")
        if resp.status == 404:
            return Unreachable(f"{what}: 404 from something that is not a registry")
        return RegistryError(f"{what}: {resp.status}")

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
        self, ref: ImageRef, blob: Descriptor, dest: Path, progress: FetchProgress | None = None
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
            except EgressRefused:
                raise  # refused again however often it is asked
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
        async with await self._send("GET", ref, path, headers=headers, elsewhere=True) as resp:
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
        path = f"{ref.repository}/blobs/{digest}"
        async with await self._send("HEAD", ref, path, elsewhere=True) as resp:
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


async def _registry_answer(resp: aiohttp.ClientResponse) -> bool:
    """Whether an error answer is a registry's: the distribution API's version header, or a
    JSON body with its `errors` list."""
    if "Docker-Distribution-Api-Version" in resp.headers:
        return True
    try:
        body = json.loads(await resp.content.read(ERROR_PEEK))
    except (ValueError, UnicodeDecodeError, aiohttp.ClientError):
        return False
    return isinstance(body, dict) and isinstance(body.get("errors"), list)


def _hash_file(path: Path) -> hashlib._Hash:
    hasher = hashlib.sha256()
    with open(path, "rb") as f:
        while block := f.read(CHUNK):
            hasher.update(block)
    return hasher
