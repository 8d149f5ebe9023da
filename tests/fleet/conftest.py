"""One fleet for the whole package (starting nine processes is most of the time): three
clustered nats-servers, workers w1 and w2 in region mad, broker b1, each in its own namespace.
Every test leaves it whole again: faults healed, servers restarted, machines destroyed."""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import pytest

from souk.broker.tokens import mint
from souk.node.cluster_secret import new_secret, read_secret
from tests.fleet.netbed import NetBed, unavailable
from tests.fleet.parts import NATS, Fleet, build, eventually

_apps = itertools.count(1)


@pytest.fixture(scope="session")
def fleet_session(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Fleet]:
    why = unavailable() or (None if NATS else "nats-server is not installed")
    if why:
        pytest.skip(f"the fleet test bed needs network namespaces: {why}")
    logs = tmp_path_factory.mktemp("fleet")
    secret = logs / "secret"
    secret.write_bytes(new_secret() + b"\n")
    token = mint(read_secret(secret), operator=True)
    bed = NetBed().up()
    try:
        fleet = build(bed, logs, secret, token, workers=["mad", "mad"])
        try:
            fleet.start()
            yield fleet
        finally:
            fleet.close()
    finally:
        bed.down()


@pytest.fixture
def fleet(fleet_session: Fleet) -> Iterator[Fleet]:
    """The fleet, whole before the test and made whole again after it."""
    yield fleet_session
    restore(fleet_session)


def restore(fleet: Fleet) -> None:
    fleet.bed.heal()
    for server in fleet.nats:
        if not server.alive:
            server.start()
    eventually(fleet.cluster_formed, 20, "the nats cluster's routes again")
    eventually(fleet.all_connected, 20, "every part on the bus again")
    for worker in fleet.workers:
        worker.destroy_all()
    fleet.placeable_everywhere()


@pytest.fixture
def app(fleet: Fleet) -> str:
    """A new app, registered through the broker."""
    name = f"fleet{next(_apps)}"
    status, body = fleet.broker.api("POST", "/v1/apps", {"name": name})
    assert status == 201, body
    return name
