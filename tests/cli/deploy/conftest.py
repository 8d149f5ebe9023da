"""One `souk dev` cluster for the whole session: the deploy tests only add and remove apps."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.dev import Dev, souk_dev


@pytest.fixture(scope="session")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Dev]:
    with souk_dev(tmp_path_factory.mktemp("souk-dev")) as cluster:
        yield cluster
