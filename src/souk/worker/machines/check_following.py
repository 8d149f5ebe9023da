"""Which health checks run: those of every started machine, each bound to its current process.

Results are kept per process (instance id, pid, address): a machine that starts a new process,
or leaves `started`, gets its checks' results dropped, and a new process is probed afresh.
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from souk.models.machine import Check, CheckStatus, Service, named_checks
from souk.worker.machines.checks import HealthChecks, RunKey
from souk.worker.state import queries
from souk.worker.state.store import Commit, Store


def _run_key(row: Any) -> RunKey:
    """Which process of the machine its check results are about."""
    return (row["instance_id"], row["pid"], row["private_ip"] or "127.0.0.1")


class CheckFollowing:
    def __init__(self, store: Store, checks: HealthChecks) -> None:
        self.store = store
        self.checks = checks

    def on_commit(self, commit: Commit) -> None:
        if not self.checks.closed:
            self.sync([key for kind, key in commit.touched if kind == "machine"])

    def sync(self, machine_ids: list[str]) -> None:
        """Check each machine's current process while it is started; forget results otherwise.
        One query per batch of machines: this runs after every commit."""
        started = queries.started_with_checks(self.store.read, machine_ids)
        for machine_id in machine_ids:
            row = started.get(machine_id)
            if row is None:
                self.checks.forget(machine_id)
                continue
            key = _run_key(row)
            if not self.checks.following(machine_id, key):
                checks = json.loads(row["checks"] or "{}")
                services = json.loads(row["services"] or "[]")
                self.checks.follow(
                    machine_id,
                    key,
                    named_checks(
                        {n: Check.model_validate(c) for n, c in checks.items()},
                        [Service.model_validate(v) for v in services],
                    ),
                )

    def observed(self, row: Any) -> list[CheckStatus]:
        """The checks of the row's process. The commit listener may not have run yet when a
        reader sees a new state: a started machine is followed here at once, so that no answer
        says `started` without its checks, and no other state carries any."""
        if row["state"] != "started":
            return []
        if not self.checks.following(row["id"], _run_key(row)) and not self.checks.closed:
            try:
                asyncio.get_running_loop()
            except RuntimeError:  # read from another thread: the listener will catch up
                return self.checks.statuses(row["id"])
            self.sync([row["id"]])
        return self.checks.statuses(row["id"])
