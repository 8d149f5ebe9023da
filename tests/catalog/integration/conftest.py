"""The catalog of real processes, shared by the module's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.support.catalog_cluster import Cluster, catalog_cluster
from tests.support.nats import NATS


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    """One cluster for the module (starting seven processes is most of the time); each test
    leaves every process it stopped running again."""
    tmp_path = tmp_path_factory.mktemp("catalog")
    if NATS is None:
        pytest.skip("nats-server is not installed")
    with catalog_cluster(tmp_path) as c:
        yield c
