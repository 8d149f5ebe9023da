"""A real registry (Debian's docker-registry) on a free loopback port, and images built by our
own code. The registry's access log is how tests count what was downloaded."""

from __future__ import annotations

import json
import re
import shutil
import socket
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
from souk.worker.oci.build import ImageSpec, Layer, busybox_layer, layer, push_image
from souk.worker.oci.images import ImageCache
from souk.worker.oci.manifest import Descriptor
from souk.worker.oci.reference import ImageRef
from souk.worker.oci.registry import RegistryClient, RegistryConfig

REGISTRY = shutil.which("docker-registry") or shutil.which("registry")
ACCESS = re.compile(r'"(?P<method>[A-Z]+) (?P<path>\S+) HTTP/[\d.]+" (?P<status>\d+)')

needs_registry = pytest.mark.skipif(REGISTRY is None, reason="docker-registry is not installed")


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

    def client(self, **overrides: object) -> RegistryClient:
        creds = {self.host: self.credentials} if self.credentials else {}
        values: dict[str, object] = {"insecure": frozenset({self.host}), "credentials": creds}
        values.update(overrides)
        return RegistryClient(RegistryConfig(**values))  # type: ignore[arg-type]

    def ref(self, name: str) -> ImageRef:
        repo, _, tag = name.partition(":")
        return ImageRef(self.host, repo, tag or None)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def htpasswd(username: str, password: str) -> str:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        import crypt

        return f"{username}:{crypt.crypt(password, crypt.mksalt(crypt.METHOD_BLOWFISH))}\n"


def start_registry(root: Path, auth: str = "") -> Iterator[tuple[str, Path]]:
    assert REGISTRY is not None
    root.mkdir(parents=True, exist_ok=True)
    host = f"127.0.0.1:{free_port()}"
    config = root / "config.yml"
    config.write_text(
        "version: 0.1\n"
        "log: {level: error, accesslog: {disabled: false}}\n"
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
        yield host, log
    finally:
        proc.terminate()
        proc.wait(timeout=10)


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    if REGISTRY is None:
        pytest.skip("docker-registry is not installed")
    for host, log in start_registry(tmp_path / "registry"):
        yield Registry(host, log)


@pytest.fixture
def basic_registry(tmp_path: Path) -> Iterator[Registry]:
    """A registry behind htpasswd (HTTP Basic) auth."""
    if REGISTRY is None:
        pytest.skip("docker-registry is not installed")
    root = tmp_path / "basic-registry"
    root.mkdir()
    (root / "htpasswd").write_text(htpasswd("alice", "s3cret"))
    auth = f"auth: {{htpasswd: {{realm: souk-test, path: {root / 'htpasswd'}}}}}\n"
    for host, log in start_registry(root, auth):
        yield Registry(host, log, Credentials("alice", "s3cret"))


@pytest.fixture(scope="session")
def busybox_base() -> Layer:
    if shutil.which("busybox") is None:
        pytest.skip("busybox is not installed")
    return layer(busybox_layer().bytes())


@pytest.fixture
async def client(registry: Registry) -> AsyncIterator[RegistryClient]:
    async with registry.client() as c:
        yield c


async def push(
    client: RegistryClient, registry: Registry, name: str, spec: ImageSpec
) -> Descriptor:
    return await push_image(client, registry.ref(name), spec)


@pytest.fixture
async def make_cache(
    registry: Registry, tmp_path: Path
) -> AsyncIterator[Callable[..., ImageCache]]:
    """ImageCaches on their own directories, all reaching the test registry; closed after."""
    made: list[ImageCache] = []

    def make(name: str = "cache", **options: Any) -> ImageCache:
        cache = ImageCache(tmp_path / name, registry.client(), **options)
        made.append(cache)
        return cache

    yield make
    for cache in made:
        for pin in (cache.store.root / "pins").glob("*.json"):
            await cache.release_rootfs(Path(json.loads(pin.read_text())["holder"]))
        await cache.client.close()
