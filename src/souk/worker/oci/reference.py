"""Image references (`registry/name:tag`, `registry/name@sha256:...`), parsed the way Docker does
except that a registry is never guessed: it must be named, or configured as the default."""

from __future__ import annotations

import re
from dataclasses import dataclass

DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")
TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")
COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
DOCKER_HUB = ("docker.io", "index.docker.io", "registry-1.docker.io")


class ReferenceError(ValueError):
    """Not a valid image reference."""


@dataclass(frozen=True)
class ImageRef:
    registry: str  # host[:port], as used in URLs
    repository: str
    tag: str | None = None
    digest: str | None = None

    @property
    def reference(self) -> str:
        """What goes after /manifests/: the digest when pinned, else the tag."""
        return self.digest or self.tag or "latest"

    def with_digest(self, digest: str) -> ImageRef:
        return ImageRef(self.registry, self.repository, self.tag, digest)

    def __str__(self) -> str:
        text = f"{self.registry}/{self.repository}"
        if self.tag:
            text += f":{self.tag}"
        if self.digest:
            text += f"@{self.digest}"
        return text


def _is_registry(part: str) -> bool:
    return "." in part or ":" in part or part == "localhost"


def parse_reference(text: str, default_registry: str | None = None) -> ImageRef:
    """Parse `[registry/]name[:tag][@digest]`; a bare name needs `default_registry`."""
    rest, _, digest = text.strip().partition("@")
    if digest and not DIGEST.match(digest):
        raise ReferenceError(f"bad digest in {text!r} (only sha256 is supported)")
    tag: str | None = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        if not TAG.match(tag):
            raise ReferenceError(f"bad tag in {text!r}")
    first, sep, remainder = rest.partition("/")
    if sep and _is_registry(first):
        registry, repository = first, remainder
    elif default_registry:
        registry, repository = default_registry, rest
    else:
        raise ReferenceError(f"{text!r} names no registry and no default registry is configured")
    if registry in DOCKER_HUB:
        registry = "registry-1.docker.io"
        if "/" not in repository:
            repository = f"library/{repository}"
    if not repository or not all(COMPONENT.match(c) for c in repository.split("/")):
        raise ReferenceError(f"bad repository name in {text!r}")
    if not tag and not digest:
        tag = "latest"
    return ImageRef(registry, repository, tag, digest or None)
