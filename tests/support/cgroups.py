"""A fixture: cgroups of a group of its own for one test, where the host lets us write them."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

import pytest

from souk.worker.host.cgroups import ROOT, Cgroups


@pytest.fixture
def cgroups() -> Iterator[Cgroups]:
    groups = Cgroups(f"souk-test-{uuid.uuid4().hex[:8]}")
    if groups.outside() is None:
        pytest.skip("this host gives no cgroups to write")
    yield groups
    for controller in ("", "memory", "cpu", "freezer"):
        with contextlib.suppress(OSError):
            (ROOT / controller / groups.group).rmdir()
