"""A machine as the operation engine runs it (`MACHINES`: its state table, its queue and rows,
what a failure leaves it in), and the forced destroy, which ends whatever its queue was doing.
"""

from __future__ import annotations

import json
from typing import Any, cast

from aiohttp import ClientError

from souk.models.machine import MachineState
from souk.worker.errors import WorkerError
from souk.worker.oci.auth import AuthError
from souk.worker.oci.manifest import ManifestError
from souk.worker.oci.reference import ReferenceError as BadReference
from souk.worker.oci.registry import RegistryError
from souk.worker.ops.fsm import MACHINE, OPERATIONS, TRANSITIONS
from souk.worker.ops.progress import Kind, StepRun, enqueue
from souk.worker.state import queries
from souk.worker.state.operations import MACHINE_QUEUE
from souk.worker.state.store import Tx, now_iso

# Failures that are the request's or a registry's (no such image, a bad reference, a refusal, a
# registry out of reach): one line with the reason; anything else is unforeseen and logged with
# its traceback.
EXPECTED = (WorkerError, RegistryError, AuthError, ManifestError, BadReference, ClientError)


def _failed(host: object, tx: Tx, run: StepRun, state: str) -> str:
    """A failed operation fails the machine (where its state may go to `failed`), and leaves
    it no process of record."""
    if "failed" in TRANSITIONS[cast(MachineState, state)]:
        state = "failed"
    queries.set_failed(tx, run.resource, state, now_iso())
    return state


MACHINES = Kind(MACHINE, MACHINE_QUEUE, _failed, EXPECTED)


def supersede(tx: Tx, machine_id: str, by: str) -> int:
    """End every operation queued for the machine, where it stands, logging each as
    superseded: a forced destroy does not wait behind them. Returns how many were ended."""
    pending = MACHINE_QUEUE.pending(tx, machine_id)
    for row in pending:
        MACHINE_QUEUE.finish(tx, row["id"])
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
    pending = MACHINE_QUEUE.pending(tx, machine_id)
    if any(r["op"] == "destroy" and json.loads(r["params"]).get("force") for r in pending):
        return False
    supersede(tx, machine_id, "destroy")
    enqueue(
        tx, MACHINES, machine_id, OPERATIONS["destroy"], row["state"], {**params, "force": True}
    )
    return True
