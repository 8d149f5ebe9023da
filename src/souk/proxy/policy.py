"""What a machine's service config says about routing: concurrency limits, autostart, autostop.

Catalog rows carry a machine's address and ports but not its services' settings, so the proxy
reads them from the broker (one list call per app) and keeps them per machine *instance*: an
update gives a machine a new instance id, which is what invalidates the entry. A machine whose
settings are not known yet is treated as unlimited, autostart on, autostop off: requests are
never held back for a lookup, and nothing is stopped on a guess.
"""

from __future__ import annotations

import asyncio
import logging
import time
from dataclasses import dataclass

from souk.clients.machines import MachinesApiError, MachinesClient
from souk.models.catalog import MachineRow
from souk.models.machine_config import MachineConfig

log = logging.getLogger("souk.proxy.policy")

MAX_ENTRIES = 100_000
RETRY_AFTER = 5.0  # seconds between background lookups of one app


@dataclass(frozen=True)
class ServicePolicy:
    soft_limit: int | None = None  # None: unlimited
    hard_limit: int | None = None
    autostart: bool = True
    autostop: bool = False
    min_machines_running: int = 0
    force_https: bool = False  # a port of the service asks for plain HTTP to be redirected


UNKNOWN = ServicePolicy()


def policy_of(config: MachineConfig) -> ServicePolicy:
    """From the machine's first service (the one whose internal port the proxy forwards to)."""
    if not config.services:
        return UNKNOWN
    service = config.services[0]
    limits = service.concurrency
    return ServicePolicy(
        soft_limit=limits.soft_limit if limits else None,
        hard_limit=limits.hard_limit if limits else None,
        autostart=service.autostart and not config.disable_machine_autostart,
        autostop=service.autostop != "off",
        min_machines_running=service.min_machines_running,
        force_https=any(port.force_https for port in service.ports),
    )


class Policies:
    """Service settings per machine instance, read from the broker, one lookup per app at a time."""

    def __init__(self, broker: MachinesClient) -> None:
        self.broker = broker
        self._known: dict[tuple[str, str], ServicePolicy] = {}
        self._loading: dict[str, asyncio.Task[None]] = {}
        self._loaded: dict[str, float] = {}  # app -> when its last lookup ended

    def get(self, row: MachineRow) -> ServicePolicy | None:
        return self._known.get((row.id, row.instance_id))

    def put(self, machine_id: str, instance_id: str, policy: ServicePolicy) -> None:
        if len(self._known) >= MAX_ENTRIES:
            self._known.clear()  # crude but bounded; entries are cheap to read again
        self._known[(machine_id, instance_id)] = policy

    def of(self, row: MachineRow) -> ServicePolicy:
        """What is known, or the defaults; asks the broker in the background when unknown."""
        known = self.get(row)
        if known is None:
            self.refresh_soon(row.app)
            return UNKNOWN
        return known

    def refresh_soon(self, app: str) -> None:
        """A background lookup, at most one per app every few seconds (a machine the broker
        does not list, or a broker that cannot be reached, must not cost a call per request)."""
        last = self._loaded.get(app)
        if app in self._loading or (last is not None and time.monotonic() - last < RETRY_AFTER):
            return
        self._loading[app] = asyncio.create_task(self._load(app))

    async def load(self, app: str) -> None:
        """Every machine of the app, from one broker call (shared by concurrent callers)."""
        task = self._loading.get(app)
        if task is None:
            task = self._loading[app] = asyncio.create_task(self._load(app))
        await asyncio.shield(task)

    async def ensure(self, rows: list[MachineRow]) -> None:
        """Known settings for these rows (all of one app), if the broker can tell."""
        missing = {row.app for row in rows if self.get(row) is None}
        for app in missing:
            await self.load(app)

    async def _load(self, app: str) -> None:
        try:
            for machine in await self.broker.machines(app):
                self.put(machine.id, machine.instance_id, policy_of(machine.config))
        except MachinesApiError as exc:
            log.warning("could not read the service settings of %s: %s", app, exc)
        finally:
            self._loading.pop(app, None)
            if len(self._loaded) >= MAX_ENTRIES:
                self._loaded.clear()
            self._loaded[app] = time.monotonic()

    async def close(self) -> None:
        for task in list(self._loading.values()):
            task.cancel()
        self._loading.clear()
