"""The worker's refusals and the HTTP answers api.py makes of them, in one table."""

from __future__ import annotations

import pytest

from souk.models.capacity import OfferRequest
from souk.models.machine import CreateMachine, GuestConfig, MachineConfig
from souk.worker.engine import Engine
from souk.worker.errors import (
    AlreadyExists,
    Cordoned,
    InvalidState,
    LeaseHeld,
    NoRoom,
    NotFound,
    WorkerError,
)
from souk.worker.http import http_error


@pytest.mark.parametrize(
    ("error", "status", "reason"),
    [
        (NotFound, 404, "not_found"),
        (InvalidState, 409, "invalid_state"),
        (AlreadyExists, 409, "already_exists"),
        (LeaseHeld, 409, "lease_held"),
        (Cordoned, 409, "cordoned"),
        (NoRoom, 412, "insufficient_capacity"),
    ],
)
def test_each_refusal_has_its_status_and_reason(
    error: type[WorkerError], status: int, reason: str
) -> None:
    answer = http_error(error("why not", {"free": 1}))
    assert (answer.http_status, answer.reason) == (status, reason)
    assert answer.message == "why not" and answer.details == {"free": 1}


async def test_a_guest_of_cpus_the_worker_lacks_is_refused_with_its_kinds(
    sim_engine: Engine,
) -> None:
    guest = GuestConfig(cpu_kind="performance")
    offer = sim_engine.offer(OfferRequest(guest=guest))
    assert not offer.fits
    config = MachineConfig(init={"exec": ["x"]}, guest=guest)  # type: ignore[arg-type]
    with pytest.raises(NoRoom) as err:
        await sim_engine.create(CreateMachine(app="demo", config=config))
    assert err.value.details == {"cpu_kinds": ["shared"]}
    assert "no performance cpus" in err.value.message


async def test_a_cordoned_worker_offers_nothing_and_refuses_with_a_conflict(
    sim_engine: Engine,
) -> None:
    await sim_engine.set_cordoned(True)
    assert not sim_engine.offer(OfferRequest(guest=GuestConfig())).fits
    config = MachineConfig(init={"exec": ["x"]})  # type: ignore[arg-type]
    with pytest.raises(Cordoned) as err:
        await sim_engine.create(CreateMachine(app="demo", config=config))
    assert http_error(err.value).http_status == 409 and err.value.details is None
