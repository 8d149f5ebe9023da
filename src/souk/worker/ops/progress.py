"""An operation's course as the log records it: queued, each step done or skipped, failed.

Each record is one transaction, which also moves the machine only along fsm.py's transitions
and keeps its *projected* state (its state once every queued operation has run) true.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from souk.models.machine import MachineState
from souk.worker.ops.fsm import OPERATIONS, TRANSITIONS, Operation, Step, check_transition
from souk.worker.state import queries
from souk.worker.state.store import Store, Tx, now_iso


class Superseded(Exception):
    """The operation was ended by a forced destroy while one of its steps ran: what that step
    did is the destroy's to undo, and nothing of it is logged."""


@dataclass(frozen=True)
class StepRun:
    """One step of one queued operation: what the runner hands the step's implementation."""

    machine_id: str
    op_id: int
    op: Operation
    index: int
    params: dict[str, Any]

    @property
    def step(self) -> Step:
        return self.op.steps[self.index]


def enqueue(
    tx: Tx, machine_id: str, op: Operation, projected: MachineState, params: dict[str, Any]
) -> None:
    """Queue `op`, accepted from `projected`; the machine is projected to end where it does."""
    op_id = queries.insert_operation(tx, machine_id, op.name, params)
    queries.set_projected(tx, machine_id, op.ends_in or projected)
    tx.log("machine", machine_id, op.name, "accepted", None, op_id, params)


def supersede(tx: Tx, machine_id: str, by: str) -> int:
    """End every operation queued for the machine, where it stands, logging each as
    superseded: a forced destroy does not wait behind them. Returns how many were ended."""
    pending = queries.pending_operations(tx, machine_id)
    for row in pending:
        queries.finish_operation(tx, row["id"])
        tx.log("machine", machine_id, row["op"], "superseded", None, row["id"], {"by": by})
    return len(pending)


def force_destroy(tx: Tx, machine_id: str, params: dict[str, Any]) -> bool:
    """Queue a forced destroy that waits behind nothing: whatever the machine's queue was doing
    (a stop waiting out a long timeout, a start blocked on its image, a plain destroy) ends
    where it stands, and the destroy kills at once from any state. False when the machine is
    destroyed or a forced destroy is queued already. Its runner must then be preempted
    (`Runner.preempt`): the step it runs belongs to an operation that is over."""
    row = queries.existing_machine(tx, machine_id)
    if row["state"] == "destroyed":
        return False
    pending = queries.pending_operations(tx, machine_id)
    if any(r["op"] == "destroy" and json.loads(r["params"]).get("force") for r in pending):
        return False
    supersede(tx, machine_id, "destroy")
    enqueue(tx, machine_id, OPERATIONS["destroy"], row["state"], {**params, "force": True})
    return True


def _still_pending(tx: Tx, run: StepRun) -> None:
    if queries.operation_done(tx, run.op_id):
        raise Superseded(f"{run.op.name} of {run.machine_id} was superseded")


def settle_projection(tx: Tx, machine_id: str) -> None:
    """With no operation left queued, the projected state is simply the state."""
    if not queries.has_pending(tx, machine_id):
        queries.reset_projection(tx, machine_id)


async def advance(
    store: Store,
    run: StepRun,
    data: dict[str, Any] | None = None,
    after: int | None = None,
    also: Callable[[Tx], None] | None = None,
    **columns: Any,
) -> int:
    """Log the step as complete, entering its state and setting `columns`, in one transaction.
    `after`: the first step of the operation not logged yet, when earlier steps (fsm.py's
    `with_next`) are to be logged in this same commit; `also`: more the step writes, in it too.
    Returns the index of the next step."""
    step, machine_id = run.step, run.machine_id
    last = run.index == len(run.op.steps) - 1
    first = run.index if after is None else after

    def commit(tx: Tx) -> None:
        _still_pending(tx, run)
        row = queries.existing_machine(tx, machine_id)
        state = row["state"]
        for earlier in run.op.steps[first : run.index]:
            state = _enter(tx, run, earlier, state, None)
        state = _enter(tx, run, step, state, data)
        queries.set_columns(tx, machine_id, {"state": state, "updated_at": now_iso(), **columns})
        queries.set_progress(tx, run.op_id, run.index + 1, last)
        if also is not None:
            also(tx)
        if last:
            settle_projection(tx, machine_id)

    await store.write(commit)
    return run.index + 1


def _enter(
    tx: Tx, run: StepRun, step: Step, state: MachineState, data: dict[str, Any] | None
) -> MachineState:
    """Log one step, checking the move to the state it enters; returns the state now."""
    new = step.enters or state
    check_transition(state, new)
    tx.log("machine", run.machine_id, run.op.name, step.name, new, run.op_id, data)
    return new


async def skip(store: Store, run: StepRun, to: int, why: str) -> int:
    """Jump over steps that have nothing to do, logging why; past the end ends the operation.
    Returns `to`."""
    done = to >= len(run.op.steps)

    def commit(tx: Tx) -> None:
        _still_pending(tx, run)
        queries.set_progress(tx, run.op_id, to, done)
        tx.log("machine", run.machine_id, run.op.name, "skipped", None, run.op_id, {"why": why})
        if done:
            settle_projection(tx, run.machine_id)

    await store.write(commit)
    return to


async def fail(store: Store, machine_id: str, op_id: int, op: Operation, error: str) -> None:
    """The operation cannot go on: the machine fails (where it may), the queue moves on."""

    def commit(tx: Tx) -> None:
        if queries.operation_done(tx, op_id):  # superseded meanwhile: the destroy decides
            return
        row = queries.existing_machine(tx, machine_id)
        state: MachineState = row["state"]
        index = queries.operation_progress(tx, op_id)
        while index < len(op.steps) and op.steps[index].with_next:  # done, and not logged yet
            run = StepRun(machine_id, op_id, op, index, {})
            state = _enter(tx, run, op.steps[index], state, None)
            index += 1
        state = "failed" if "failed" in TRANSITIONS[state] else state
        queries.set_failed(tx, machine_id, state, now_iso())
        queries.finish_operation(tx, op_id)
        tx.log("machine", machine_id, op.name, "error", state, op_id, {"error": error})
        settle_projection(tx, machine_id)

    await store.write(commit)
