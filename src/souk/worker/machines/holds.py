"""Provisional machines: a create a broker makes is held until that broker confirms it has
answered its client, and destroyed by the worker itself if no confirmation comes in time.

A worker killed after it commits a create but before the answer reaches the broker (or a broker
killed before it answers its client) would otherwise leave a machine nobody was told about. The
hold's deadline is committed with the machine, so it survives a `kill -9`: after any crash, every
machine either was confirmed (its creator answered a client) or is destroyed once its deadline
passes. fsm.py declares the hold's states; docs/reliability.md states the bound.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import time
from collections.abc import Callable

from souk.worker.machines.operations import force_destroy
from souk.worker.ops.fsm import HOLD_TRANSITIONS, HoldState
from souk.worker.state import queries
from souk.worker.state.store import Store, Tx

log = logging.getLogger("souk.worker")

MAX_HOLD = 3600.0  # a longer hold asked for is cut to this
RETRY_AFTER_FAULT = 1.0  # seconds before trying to expire holds again after a failed commit


def _moved(tx: Tx, machine_id: str, to: HoldState, data: dict[str, object]) -> None:
    if to not in HOLD_TRANSITIONS["provisional"]:
        raise ValueError(f"a hold cannot go from provisional to {to}")
    tx.log("machine", machine_id, "hold", to, None, data=data)


def confirm(tx: Tx, machine_ids: list[str]) -> dict[str, str]:
    """Each id's hold as it is now: `confirmed` (now or before), `expired` (too late: the
    machine is being destroyed) or `unknown` (not a machine of this worker)."""
    out: dict[str, str] = {}
    for machine_id in machine_ids:
        row = queries.machine(tx, machine_id)
        if row is None:
            out[machine_id] = "unknown"
        elif queries.delete_hold(tx, machine_id):
            _moved(tx, machine_id, "confirmed", {})
            out[machine_id] = "confirmed"
        elif row["projected"] in ("destroying", "destroyed") and _expired(tx, machine_id):
            out[machine_id] = "expired"
        else:
            out[machine_id] = "confirmed"
    return out


def _expired(tx: Tx, machine_id: str) -> bool:
    row = tx.one(
        "SELECT 1 FROM oplog WHERE resource = ? AND op = 'hold' AND step = 'expired' LIMIT 1",
        (machine_id,),
    )
    return row is not None


def expire_due(tx: Tx, now: float) -> list[str]:
    """End every hold past its deadline: a forced destroy is queued for each machine not
    already being destroyed so, ending what its queue was doing. Returns the machines whose
    runner must be preempted."""
    due = queries.due_holds(tx, now)
    for machine_id in due:
        queries.delete_hold(tx, machine_id)
        row = queries.machine(tx, machine_id)
        if row is None:
            continue
        _moved(tx, machine_id, "expired", {"why": "no confirmation from its creator"})
        force_destroy(tx, machine_id, {"force": True})
    return due


class HoldKeeper:
    """Sleeps until the earliest hold's deadline, then expires what is due."""

    def __init__(self, store: Store, kick: Callable[[str], None]) -> None:
        self.store = store
        self.kick = kick
        self._wake = asyncio.Event()
        self._task: asyncio.Task[None] | None = None

    def start(self) -> None:
        if self._task is None:
            self._task = asyncio.create_task(self._run())

    def poke(self) -> None:
        """A new hold may end before the one being waited for."""
        self._wake.set()

    async def close(self) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task

    async def _run(self) -> None:
        while True:
            try:
                await self._expire_or_wait()
            except asyncio.CancelledError:
                raise
            except Exception:  # a full disk, say: the holds stay, and are tried again
                log.exception("could not expire provisional machines")
                await asyncio.sleep(RETRY_AFTER_FAULT)

    async def _expire_or_wait(self) -> None:
        self._wake.clear()
        deadline = queries.next_hold(self.store.read)
        now = time.time()
        if deadline is not None and deadline <= now:
            due = await self.store.write(functools.partial(expire_due, now=now))
            for machine_id in due:
                log.warning("machine %s was never confirmed: destroying it", machine_id)
                self.kick(machine_id)
            return
        timeout = None if deadline is None else deadline - now
        with contextlib.suppress(TimeoutError):
            async with asyncio.timeout(timeout):  # not wait_for: it may swallow a cancel
                await self._wake.wait()
