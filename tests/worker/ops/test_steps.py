"""Each step fsm.py declares, a machine's or a volume's, has exactly one implementation, and each
implementation a step."""

from __future__ import annotations

import pytest

from souk.worker.machines.steps import STEPS, StepHost
from souk.worker.ops.fsm import OPERATIONS, STEP_NAMES, VOLUME, VOLUME_OPERATIONS
from souk.worker.ops.progress import StepRun
from souk.worker.ops.steps import StepTable
from souk.worker.volumes import steps as volume_steps


async def _noop(host: StepHost, run: StepRun) -> int:
    return run.index + 1


def test_every_declared_step_has_its_implementation() -> None:
    assert STEPS.implemented == STEP_NAMES
    for op in OPERATIONS.values():
        for step in op.steps:
            assert callable(STEPS[step.name])


def test_every_declared_volume_step_has_its_implementation() -> None:
    assert volume_steps.STEPS.implemented == VOLUME.step_names
    for op in VOLUME_OPERATIONS.values():
        for step in op.steps:
            assert callable(volume_steps.STEPS[step.name])


def test_a_step_no_operation_declares_is_refused() -> None:
    table: StepTable[StepHost] = StepTable({"spawn"})
    with pytest.raises(LookupError, match="no operation declares"):
        table.implements("teleport")(_noop)


def test_a_step_implemented_twice_is_refused() -> None:
    table: StepTable[StepHost] = StepTable({"spawn"})
    table.implements("spawn")(_noop)
    with pytest.raises(LookupError, match="twice"):
        table.implements("spawn")(_noop)


def test_a_declared_step_without_implementation_is_found() -> None:
    table: StepTable[StepHost] = StepTable({"spawn", "kill"})
    table.implements("spawn")(_noop)
    with pytest.raises(LookupError, match="kill"):
        table.check_complete()
    table.implements("kill")(_noop)
    table.check_complete()
