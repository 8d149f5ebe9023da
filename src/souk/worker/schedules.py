"""Fly's `schedule`: a machine with one is started by its worker once per period (`hourly`,
`daily`, `weekly`, `monthly`), counted from its last start, or from its creation if it never
started; it runs until it exits, then waits, stopped, for the next period.

The worker looks every `EVERY` seconds, so a start comes up to that late. What it reads is the
operation log (the last `spawn` step), so the schedule holds across worker restarts.
"""

from __future__ import annotations

import logging
import time
from datetime import datetime
from typing import TYPE_CHECKING

from souk.node.periodic import every
from souk.worker.errors import WorkerError
from souk.worker.state import queries

if TYPE_CHECKING:
    from souk.worker.engine import Engine

log = logging.getLogger("souk.worker.schedules")

EVERY = 15.0
PERIODS = {"hourly": 3600.0, "daily": 86400.0, "weekly": 7 * 86400.0, "monthly": 30 * 86400.0}


def due(schedule: str, last_start: float | None, created: float, now: float) -> bool:
    """Whether a machine on this schedule should start now."""
    since = last_start if last_start is not None else created
    return now - since >= PERIODS[schedule]


def due_machines(engine: Engine, now: float) -> list[str]:
    out = []
    for row in queries.scheduled_idle(engine.store.read):
        created = datetime.fromisoformat(row["created_at"]).timestamp()
        if row["schedule"] in PERIODS and due(row["schedule"], row["last_spawn"], created, now):
            out.append(row["id"])
    return out


async def start_due(engine: Engine, now: float | None = None) -> list[str]:
    """Start every machine whose period has come; the ids started."""
    started = []
    for machine_id in due_machines(engine, time.time() if now is None else now):
        try:
            await engine.submit(machine_id, "start")
        except WorkerError as exc:  # it moved on meanwhile (destroyed, started by hand)
            log.info("scheduled start of %s refused: %s", machine_id, exc)
            continue
        started.append(machine_id)
    return started


async def schedule_forever(engine: Engine) -> None:
    await every(EVERY, lambda: start_due(engine), what="scheduled starts", log=log)
