"""Image machines' fixtures: a real registry on loopback and a client pushing to it."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from souk.worker.oci.registry import RegistryClient
from tests.support.registry import Registry, registry_or_skip


@pytest.fixture
def registry(tmp_path: Path) -> Iterator[Registry]:
    with registry_or_skip(tmp_path / "registry") as found:
        yield found


@pytest.fixture
async def client(registry: Registry) -> AsyncIterator[RegistryClient]:
    async with registry.client() as c:
        yield c
