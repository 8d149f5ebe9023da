"""The PKI tests' fixtures: a cluster CA, and a second one that trusts nothing of the first's."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.support.pki import Pki, new_pki


@pytest.fixture
def pki(tmp_path: Path) -> Pki:
    return new_pki(tmp_path)


@pytest.fixture
def other_pki(tmp_path: Path) -> Pki:
    return new_pki(tmp_path, "other-ca")
