"""Manifests and indexes, Docker v2 and OCI alike, and picking the host's platform from an index."""

from __future__ import annotations

import json
import platform
from dataclasses import dataclass, field
from typing import Any

from souk.worker.oci.reference import DIGEST

OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_LAYER = "application/vnd.oci.image.layer.v1.tar"
OCI_LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_LAYER_ZSTD = "application/vnd.oci.image.layer.v1.tar+zstd"
DOCKER_MANIFEST = "application/vnd.docker.distribution.manifest.v2+json"
DOCKER_LIST = "application/vnd.docker.distribution.manifest.list.v2+json"
DOCKER_CONFIG = "application/vnd.docker.container.image.v1+json"
DOCKER_LAYER_GZIP = "application/vnd.docker.image.rootfs.diff.tar.gzip"

MANIFESTS = (OCI_MANIFEST, DOCKER_MANIFEST)
INDEXES = (OCI_INDEX, DOCKER_LIST)
ACCEPT = ", ".join((*MANIFESTS, *INDEXES))
LAYERS = (OCI_LAYER, OCI_LAYER_GZIP, OCI_LAYER_ZSTD, DOCKER_LAYER_GZIP)
# Go's names for machine architectures, as OCI platforms use them.
GOARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "i686": "386"}


class ManifestError(ValueError):
    """A manifest we cannot use: malformed, of an unknown type, or without our platform."""


@dataclass(frozen=True)
class Platform:
    os: str
    architecture: str
    variant: str | None = None

    def __str__(self) -> str:
        return "/".join(p for p in (self.os, self.architecture, self.variant) if p)


def host_platform() -> Platform:
    machine = platform.machine()
    return Platform("linux", GOARCH.get(machine, machine), "v8" if machine == "aarch64" else None)


@dataclass(frozen=True)
class Descriptor:
    media_type: str
    digest: str
    size: int
    platform: Platform | None = None

    @classmethod
    def parse(cls, raw: Any) -> Descriptor:
        try:
            digest, size = raw["digest"], int(raw["size"])
            media_type = raw.get("mediaType", "")
            plat = raw.get("platform")
        except (KeyError, TypeError, ValueError) as e:
            raise ManifestError(f"bad descriptor: {e}") from e
        if not isinstance(digest, str) or not DIGEST.match(digest) or size < 0:
            raise ManifestError(f"bad descriptor digest or size: {digest!r}, {size}")
        found = None
        if isinstance(plat, dict):
            arch = str(plat.get("architecture"))
            found = Platform(str(plat.get("os")), arch, plat.get("variant"))
        return cls(media_type, digest, size, found)

    def to_json(self) -> dict[str, Any]:
        return {"mediaType": self.media_type, "digest": self.digest, "size": self.size}


@dataclass(frozen=True)
class Manifest:
    config: Descriptor
    layers: list[Descriptor] = field(default_factory=list)


def _document(data: bytes) -> dict[str, Any]:
    try:
        doc = json.loads(data)
    except ValueError as e:
        raise ManifestError(f"manifest is not JSON: {e}") from e
    if not isinstance(doc, dict):
        raise ManifestError("manifest is not a JSON object")
    return doc


def media_type_of(data: bytes, header: str | None) -> str:
    """The document's own mediaType wins over the Content-Type header; OCI allows either."""
    declared = _document(data).get("mediaType")
    kind = declared if isinstance(declared, str) and declared else (header or "")
    kind = kind.split(";")[0].strip()
    if kind not in MANIFESTS + INDEXES:
        raise ManifestError(f"unsupported manifest media type {kind!r}")
    return kind


def parse_manifest(data: bytes) -> Manifest:
    doc = _document(data)
    if doc.get("schemaVersion") != 2:
        raise ManifestError("only schemaVersion 2 manifests are supported")
    layers = [Descriptor.parse(d) for d in doc.get("layers") or []]
    for layer in layers:
        if layer.media_type not in LAYERS:
            raise ManifestError(f"unsupported layer media type {layer.media_type!r}")
    return Manifest(Descriptor.parse(doc.get("config")), layers)


def choose_platform(data: bytes, want: Platform) -> Descriptor:
    """The index entry for `want`; a missing variant on either side matches any."""
    entries = [Descriptor.parse(d) for d in _document(data).get("manifests") or []]
    for entry in entries:
        p = entry.platform
        if p is None or (p.os, p.architecture) != (want.os, want.architecture):
            continue
        if p.variant and want.variant and p.variant != want.variant:
            continue
        return entry
    offered = ", ".join(str(e.platform) for e in entries)
    raise ManifestError(f"no manifest for {want} in the index (offers: {offered or 'nothing'})")
