"""A real registry (Debian's docker-registry) on a free loopback port. Its access log is how
tests count what was downloaded."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import re
import shutil
import subprocess
import time
import urllib.error
import urllib.request
import uuid
import warnings
from collections.abc import AsyncIterator, Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from souk.worker.oci.auth import Credentials
from souk.worker.oci.images import ImageCache
from souk.worker.oci.manifest import Descriptor
from souk.worker.oci.reference import ImageRef
from souk.worker.oci.registry import RegistryClient, RegistryConfig
from tests.support.images import ImageSpec, push_image
from tests.support.ports import free_port

REGISTRY = shutil.which("docker-registry") or shutil.which("registry")
ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d+)')


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    status: int


@dataclass
class Registry:
    host: str
    log: Path
    credentials: Credentials | None = None

    def requests(self) -> list[Request]:
        """Every request served so far, once a fresh sentinel request shows up in the log."""
        marker = f"/v2/sentinel-{uuid.uuid4().hex}/tags/list"
        try:
            urllib.request.urlopen(f"http://{self.host}{marker}", timeout=5)
        except urllib.error.HTTPError:
            pass
        for _ in range(500):
            text = self.log.read_text()
            if marker in text:
                return [
                    Request(m["method"], m["path"], int(m["status"]))
                    for m in ACCESS.finditer(text)
                    if "/sentinel-" not in m["path"] and m["path"] != "/v2/"  # readiness probes
                ]
            time.sleep(0.01)
        raise AssertionError("the registry never logged the sentinel request")

    def corrupt(self, digest: str) -> None:
        """Flip bytes of a stored blob, keeping its length: the registry serves it as it is."""
        hexdigest = digest.removeprefix("sha256:")
        root = self.log.parent / "data" / "docker" / "registry" / "v2" / "blobs" / "sha256"
        path = root / hexdigest[:2] / hexdigest / "data"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))

    def blob_gets(self, digest: str) -> list[Request]:
        return [r for r in self.requests() if r.method == "GET" and r.path.endswith(digest)]

    def config(self, **overrides: Any) -> RegistryConfig:
        """How a client reaches this registry: over plain http, with its credentials if any."""
        creds = {self.host: self.credentials} if self.credentials else {}
        return dataclasses.replace(
            RegistryConfig(insecure=frozenset({self.host}), credentials=creds), **overrides
        )

    def client(self, **overrides: Any) -> RegistryClient:
        return RegistryClient(self.config(**overrides))

    def ref(self, name: str) -> ImageRef:
        repo, _, tag = name.partition(":")
        return ImageRef(self.host, repo, tag or None)


def htpasswd(username: str, password: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return f"{username}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n"


@contextlib.contextmanager
def registry_or_skip(root: Path, credentials: Credentials | None = None) -> Iterator[Registry]:
    """`running_registry` for a test, which is skipped where docker-registry is not installed."""
    if REGISTRY is None:
        pytest.skip("docker-registry is not installed")
    with running_registry(root, credentials) as found:
        yield found


@contextlib.contextmanager
def running_registry(
    root: Path, credentials: Credentials | None = None, access_log: bool = True
) -> Iterator[Registry]:
    """A registry storing under `root`; with credentials, behind htpasswd (HTTP Basic) auth."""
    if REGISTRY is None:
        raise RuntimeError("docker-registry is not installed")
    root.mkdir(parents=True, exist_ok=True)
    host = f"127.0.0.1:{free_port()}"
    auth = ""
    if credentials is not None:
        (root / "htpasswd").write_text(htpasswd(credentials.username, credentials.password))
        auth = f"auth: {{htpasswd: {{realm: souk-test, path: {root / 'htpasswd'}}}}}\n"
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        f"log: {{level: error, accesslog: {{disabled: {str(not access_log).lower()}}}}}\n"
        f"storage: {{filesystem: {{rootdirectory: {root / 'data'}}}, delete: {{enabled: true}}}}\n"
        f"http: {{addr: '{host}', secret: test-secret}}\n" + auth
    )
    log = root / "access.log"
    with open(log, "wb") as out, open(root / "stderr.log", "wb") as err:
        proc = subprocess.Popen([REGISTRY, "serve", str(config)], stdout=out, stderr=err)
    try:
        for _ in range(500):
            try:
                urllib.request.urlopen(f"http://{host}/v2/", timeout=1)
                break
            except urllib.error.HTTPError:
                break  # 401: up, and wants credentials
            except OSError:
                if proc.poll() is not None:
                    raise RuntimeError((root / "stderr.log").read_text()) from None
                time.sleep(0.01)
        yield Registry(host, log, credentials)
    finally:
        proc.terminate()
        proc.wait(timeout=10)


async def push(
    client: RegistryClient, registry: Registry, name: str, spec: ImageSpec
) -> Descriptor:
    return await push_image(client, registry.ref(name), spec)


@contextlib.asynccontextmanager
async def image_caches(registry: Registry, root: Path) -> AsyncIterator[Callable[..., ImageCache]]:
    """Makes ImageCaches on their own directories under `root`, all reaching `registry`; each
    one's pinned root filesystems are released and its client closed on the way out."""
    made: list[ImageCache] = []

    def make(name: str = "cache", **options: Any) -> ImageCache:
        cache = ImageCache(root / name, registry.client(), **options)
        made.append(cache)
        return cache

    try:
        yield make
    finally:
        for cache in made:
            for pin in (cache.store.root / "pins").glob("*.json"):
                await cache.release_rootfs(Path(json.loads(pin.read_text())["holder"]))
            await cache.client.close()
