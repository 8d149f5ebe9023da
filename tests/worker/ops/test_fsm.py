from __future__ import annotations

from pathlib import Path

import pytest

from souk.worker.ops.fsm import (
    OPERATIONS,
    STATES,
    TRANSITIONS,
    IllegalTransition,
    check_transition,
    markdown,
)


def test_every_state_has_a_row_and_destroyed_is_final() -> None:
    assert set(TRANSITIONS) == set(STATES)
    assert TRANSITIONS["destroyed"] == frozenset()


@pytest.mark.parametrize(
    ("current", "wanted"),
    [("created", "starting"), ("starting", "started"), ("started", "stopping"),
     ("stopping", "stopped"), ("stopped", "starting"), ("failed", "destroying"),
     ("destroying", "destroyed"), ("started", "started")],
)  # fmt: skip
def test_legal_transitions(current: str, wanted: str) -> None:
    check_transition(current, wanted)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("current", "wanted"),
    [("created", "started"), ("stopped", "started"), ("destroyed", "starting"),
     ("destroying", "stopped"), ("stopping", "started"), ("failed", "stopped")],
)  # fmt: skip
def test_illegal_transitions(current: str, wanted: str) -> None:
    with pytest.raises(IllegalTransition):
        check_transition(current, wanted)  # type: ignore[arg-type]


def test_operation_steps_walk_only_legal_transitions() -> None:
    """Running each operation's steps from any state it accepts never makes an illegal move."""
    for op in OPERATIONS.values():
        for start in op.allowed_from:
            if op.name in ("stop", "restart") and start == "starting":
                continue  # the stop steps wait for the start to finish first
            state = start
            for step in op.steps:
                if step.enters:
                    check_transition(state, step.enters)
                    state = step.enters
            assert state == (op.ends_in or start), op.name


def test_docs_table_lists_every_state_and_operation() -> None:
    table = markdown()
    for name in [*STATES, *OPERATIONS]:
        assert f"{name}" in table


def test_the_docs_show_the_tables_as_declared() -> None:
    docs = Path(__file__).parents[3] / "docs" / "worker.md"
    assert markdown() in docs.read_text()
