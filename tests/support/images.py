"""Build images with our own code and push them over the registry API: the tests and the
benchmark need real images without docker. Layers are deterministic tarballs (mtime 0, root)."""

from __future__ import annotations

import gzip
import io
import json
import shutil
import tarfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from souk.worker.oci.manifest import (
    OCI_CONFIG,
    OCI_INDEX,
    OCI_LAYER,
    OCI_LAYER_GZIP,
    OCI_MANIFEST,
    Descriptor,
    Platform,
    host_platform,
)
from souk.worker.oci.reference import ImageRef
from souk.worker.oci.registry import RegistryClient, sha256_digest

BUSYBOX_APPLETS = ("sh", "ls", "cat", "echo", "env", "id", "pwd", "sleep", "httpd", "true", "wc")


class TarBuilder:
    """An uncompressed layer tarball, entry by entry, including deliberately bad entries."""

    def __init__(self) -> None:
        self._buf = io.BytesIO()
        self._tar = tarfile.TarFile(fileobj=self._buf, mode="w", format=tarfile.PAX_FORMAT)

    def _info(self, name: str, kind: bytes, mode: int) -> tarfile.TarInfo:
        info = tarfile.TarInfo(name)
        info.type, info.mode, info.mtime = kind, mode, 0
        return info

    def dir(self, name: str, mode: int = 0o755) -> TarBuilder:
        self._tar.addfile(self._info(name, tarfile.DIRTYPE, mode))
        return self

    def file(self, name: str, data: bytes = b"", mode: int = 0o644) -> TarBuilder:
        info = self._info(name, tarfile.REGTYPE, mode)
        info.size = len(data)
        self._tar.addfile(info, io.BytesIO(data))
        return self

    def symlink(self, name: str, target: str) -> TarBuilder:
        info = self._info(name, tarfile.SYMTYPE, 0o777)
        info.linkname = target
        self._tar.addfile(info)
        return self

    def hardlink(self, name: str, target: str) -> TarBuilder:
        info = self._info(name, tarfile.LNKTYPE, 0o644)
        info.linkname = target
        self._tar.addfile(info)
        return self

    def device(self, name: str, major: int = 1, minor: int = 3) -> TarBuilder:
        info = self._info(name, tarfile.CHRTYPE, 0o666)
        info.devmajor, info.devminor = major, minor
        self._tar.addfile(info)
        return self

    def whiteout(self, name: str) -> TarBuilder:
        parent, _, base = name.rstrip("/").rpartition("/")
        return self.file(f"{parent}/.wh.{base}" if parent else f".wh.{base}")

    def opaque(self, directory: str) -> TarBuilder:
        return self.file(f"{directory.rstrip('/')}/.wh..wh..opq")

    def bytes(self) -> bytes:
        self._tar.close()
        return self._buf.getvalue()


@dataclass(frozen=True)
class Layer:
    blob: bytes  # as stored in the registry (compressed or not)
    diff_id: str  # digest of the uncompressed tarball
    media_type: str

    @property
    def descriptor(self) -> Descriptor:
        return Descriptor(self.media_type, sha256_digest(self.blob), len(self.blob))


def layer(tar: bytes, compress: bool = True) -> Layer:
    if not compress:
        return Layer(tar, sha256_digest(tar), OCI_LAYER)
    blob = gzip.compress(tar, compresslevel=1, mtime=0)
    return Layer(blob, sha256_digest(tar), OCI_LAYER_GZIP)


def busybox_layer(busybox: Path | None = None) -> TarBuilder:
    """A minimal root filesystem around a static busybox; add to it before `.bytes()`."""
    found = busybox or shutil.which("busybox")
    if not found:
        raise FileNotFoundError("busybox (a static build) is not installed")
    tar = TarBuilder()
    for name, mode in (("bin", 0o755), ("etc", 0o755), ("tmp", 0o1777), ("root", 0o700)):
        tar.dir(name, mode)
    for name in ("proc", "sys", "dev", "www"):
        tar.dir(name)
    tar.file("bin/busybox", Path(found).resolve().read_bytes(), 0o755)
    for applet in BUSYBOX_APPLETS:
        tar.symlink(f"bin/{applet}", "busybox")
    tar.file("etc/passwd", b"root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534::/:/bin/sh\n")
    tar.file("etc/group", b"root:x:0:\nnogroup:x:65534:\n")
    return tar


@dataclass
class ImageSpec:
    layers: list[Layer]
    entrypoint: list[str] | None = None
    cmd: list[str] | None = None
    env: list[str] = field(default_factory=lambda: ["PATH=/bin"])
    workdir: str = ""
    user: str = ""
    exposed_ports: list[str] = field(default_factory=list)
    platform: Platform = field(default_factory=host_platform)

    def config(self) -> bytes:
        body: dict[str, Any] = {"Env": self.env}
        if self.entrypoint is not None:
            body["Entrypoint"] = self.entrypoint
        if self.cmd is not None:
            body["Cmd"] = self.cmd
        if self.workdir:
            body["WorkingDir"] = self.workdir
        if self.user:
            body["User"] = self.user
        if self.exposed_ports:
            body["ExposedPorts"] = {p: {} for p in self.exposed_ports}
        doc = {
            "architecture": self.platform.architecture,
            "os": self.platform.os,
            "config": body,
            "rootfs": {"type": "layers", "diff_ids": [x.diff_id for x in self.layers]},
        }
        if self.platform.variant:
            doc["variant"] = self.platform.variant
        return json.dumps(doc, sort_keys=True).encode()

    def manifest(self) -> bytes:
        config = self.config()
        doc = {
            "schemaVersion": 2,
            "mediaType": OCI_MANIFEST,
            "config": Descriptor(OCI_CONFIG, sha256_digest(config), len(config)).to_json(),
            "layers": [x.descriptor.to_json() for x in self.layers],
        }
        return json.dumps(doc, sort_keys=True).encode()


async def push_image(client: RegistryClient, ref: ImageRef, spec: ImageSpec) -> Descriptor:
    """Upload layers, config and manifest; tag it as `ref.tag` (else by digest only)."""
    for x in spec.layers:
        await client.upload_blob(ref, x.blob)
    await client.upload_blob(ref, spec.config())
    manifest = spec.manifest()
    digest = sha256_digest(manifest)
    await client.put_manifest(ref, ref.tag or digest, OCI_MANIFEST, manifest)
    return Descriptor(OCI_MANIFEST, digest, len(manifest), spec.platform)


async def push_index(client: RegistryClient, ref: ImageRef, entries: list[Descriptor]) -> str:
    """Tag an image index over already pushed manifests, one per platform."""
    manifests = []
    for entry in entries:
        item = entry.to_json()
        if entry.platform:
            plat = {"os": entry.platform.os, "architecture": entry.platform.architecture}
            if entry.platform.variant:
                plat["variant"] = entry.platform.variant
            item["platform"] = plat
        manifests.append(item)
    doc = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": manifests}
    data = json.dumps(doc, sort_keys=True).encode()
    return await client.put_manifest(ref, ref.tag or sha256_digest(data), OCI_INDEX, data)
