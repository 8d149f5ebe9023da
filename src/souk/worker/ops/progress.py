"""An operation's course as the log records it: queued, each step done or skipped, failed; the
same for every kind of resource.

Each record is one transaction, which also moves the resource only along its state machine's
transitions (fsm.py) and keeps its *projected* state (its state once every queued operation has
run) true. A kind of resource is a `Kind`: its state machine, its queue and rows (the tables
`state/operations.py` reads), and what a failed operation leaves it in.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from souk.worker.ops.fsm import Operation, StateMachine, Step
from souk.worker.state.operations import OperationQueue
from souk.worker.state.store import Store, Tx, now_iso


class Superseded(Exception):
    """The operation was ended by a forced destroy while one of its steps ran: what that step
    did is the destroy's to undo, and nothing of it is logged."""


@dataclass(frozen=True)
class Kind:
    """What the engine needs of one kind of resource: its table of states and operations, its
    queue and rows, `failed` (handed its steps' host, in the failure's transaction: the state a
    failed operation leaves the resource in, from the state it was in, with whatever else that
    undoes) and the failures `expected` of its steps (logged in a line, where any other gets its
    traceback)."""

    fsm: StateMachine[Any]
    queue: OperationQueue
    failed: Callable[[Any, Tx, StepRun, str], str]
    expected: tuple[type[BaseException], ...] = ()

    @property
    def name(self) -> str:
        return self.fsm.kind


@dataclass(frozen=True)
class StepRun:
    """One step of one queued operation: what the runner hands the step's implementation."""

    kind: Kind
    resource: str
    op_id: int
    op: Operation[Any]
    index: int
    params: dict[str, Any]

    @property
    def step(self) -> Step[Any]:
        return self.op.steps[self.index]


def enqueue(
    tx: Tx, kind: Kind, resource: str, op: Operation[Any], projected: str, params: dict[str, Any]
) -> int:
    """Queue `op`, accepted from `projected`; the resource is projected to end where it does."""
    op_id = kind.queue.insert(tx, resource, op.name, params)
    kind.queue.set_columns(tx, resource, {"projected": op.ends_in or projected})
    tx.log(kind.name, resource, op.name, "accepted", None, op_id, params)
    return op_id


def _still_pending(tx: Tx, run: StepRun) -> None:
    if run.kind.queue.done(tx, run.op_id):
        raise Superseded(f"{run.op.name} of {run.resource} was superseded")


def settle_projection(tx: Tx, kind: Kind, resource: str) -> None:
    """With no operation left queued, the projected state is simply the state."""
    if not kind.queue.has_pending(tx, resource):
        kind.queue.reset_projection(tx, resource)


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
    queue, step = run.kind.queue, run.step
    last = run.index == len(run.op.steps) - 1
    first = run.index if after is None else after

    def commit(tx: Tx) -> None:
        _still_pending(tx, run)
        state = queue.existing(tx, run.resource)["state"]
        for earlier in run.op.steps[first : run.index]:
            state = _enter(tx, run, earlier, state, None)
        state = _enter(tx, run, step, state, data)
        queue.set_columns(tx, run.resource, {"state": state, "updated_at": now_iso(), **columns})
        queue.set_progress(tx, run.op_id, run.index + 1, last)
        if also is not None:
            also(tx)
        if last:
            settle_projection(tx, run.kind, run.resource)

    await store.write(commit)
    return run.index + 1


def _enter(tx: Tx, run: StepRun, step: Step[Any], state: str, data: dict[str, Any] | None) -> str:
    """Log one step, checking the move to the state it enters; returns the state now."""
    new = step.enters or state
    run.kind.fsm.check(state, new)
    tx.log(run.kind.name, run.resource, run.op.name, step.name, new, run.op_id, data)
    return str(new)


async def skip(store: Store, run: StepRun, to: int, why: str) -> int:
    """Jump over steps that have nothing to do, logging why; past the end ends the operation.
    Returns `to`."""
    done = to >= len(run.op.steps)

    def commit(tx: Tx) -> None:
        _still_pending(tx, run)
        run.kind.queue.set_progress(tx, run.op_id, to, done)
        data = {"why": why}
        tx.log(run.kind.name, run.resource, run.op.name, "skipped", None, run.op_id, data)
        if done:
            settle_projection(tx, run.kind, run.resource)

    await store.write(commit)
    return to


async def fail(store: Store, host: object, run: StepRun, error: str) -> None:
    """The operation cannot go on: the resource is left where its kind says a failure leaves
    it, and the queue moves on."""
    kind, resource = run.kind, run.resource

    def commit(tx: Tx) -> None:
        if kind.queue.done(tx, run.op_id):  # superseded meanwhile: the destroy decides
            return
        state = kind.queue.existing(tx, resource)["state"]
        index = kind.queue.progress(tx, run.op_id)
        while index < len(run.op.steps) and run.op.steps[index].with_next:  # done, not logged
            at = StepRun(kind, resource, run.op_id, run.op, index, {})
            state = _enter(tx, at, run.op.steps[index], state, None)
            index += 1
        state = kind.failed(host, tx, run, state)
        kind.queue.finish(tx, run.op_id)
        tx.log(kind.name, resource, run.op.name, "error", state, run.op_id, {"error": error})
        settle_projection(tx, kind, resource)

    await store.write(commit)
