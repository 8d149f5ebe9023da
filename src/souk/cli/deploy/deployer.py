"""One deploy's machine operations (create, update, relabel, destroy) and its health gate.

A machine that exits or fails while the deploy waits for it stops the deploy at once, with its
exit code and last log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from souk.cli.deploy.config import AppConfig
from souk.cli.deploy.errors import Aborted, DeployError, MachineFailed
from souk.cli.deploy.leases import Leases
from souk.cli.deploy.plan import Instance, MachineView, fingerprint
from souk.cli.deploy.progress import Progress
from souk.clients.machines import MachinesApiError, MachinesClient
from souk.models.api import CreateMachineRequest, MetadataPatch, UpdateMachineRequest
from souk.models.machine_config import MachineConfig
from souk.models.volume import CreateVolumeRequest
from souk.models.wire import Role

POLL = 0.2
LOG_LINES = 15
DESTROY_WAIT = 30.0  # a destroy returns once the machine is destroyed: its process is gone


def crashed_last(m: MachineView) -> bool:
    """Whether the machine's last exit was a crash rather than a stop that was asked for."""
    for e in sorted(m.events, key=lambda e: e.id, reverse=True):
        if e.type == "exit":
            return "restart" in e.request
        if e.type == "stop":
            return False
    return False


def _millis(iso: str) -> int:
    """An ISO time as the worker writes it, in milliseconds since the epoch (0 if unreadable)."""
    try:
        return int(datetime.fromisoformat(iso).timestamp() * 1000)
    except ValueError:
        return 0


def _tail(text: str, lines: int = LOG_LINES) -> list[str]:
    return text.rstrip("\n").splitlines()[-lines:] if text.strip() else []


@dataclass
class Deployer:
    """One deploy's machine operations: create, update, relabel, destroy, gate."""

    api: MachinesClient
    cfg: AppConfig
    release: int
    progress: Progress
    leases: Leases
    secrets: str = ""  # the digest of the app's secrets (see `souk.cli.deploy.secrets`)
    fp: str = ""
    created: list[str] = field(default_factory=list)
    aborted: bool = False

    def __post_init__(self) -> None:
        self.fp = fingerprint(self._config("primary"))

    @property
    def app(self) -> str:
        return self.cfg.app

    def _config(
        self,
        role: Role,
        standby_for: str | None = None,
        hidden: bool = False,
        volume: str | None = None,
    ) -> MachineConfig:
        return self.cfg.machine_config(
            self.release, role, standby_for, hidden, self.secrets, volume
        )

    async def _volume(self, region: str) -> str | None:
        """With [mounts], a new volume for a new primary: placed by the broker apart from the
        app's others of the same name (require_unique_zone), and the machine then placed on its
        worker."""
        mounts = self.cfg.mounts
        if mounts is None:
            return None
        req = CreateVolumeRequest(
            name=mounts.source,
            region=region,
            snapshot_retention=mounts.snapshot_retention,
            **mounts.size(),
        )
        try:
            volume = await self.api.create_volume(self.app, req)
        except MachinesApiError as exc:
            raise DeployError(
                f"could not create a volume in {region}: {exc}", region=region
            ) from None
        self.progress.step(
            f"created volume {volume.id} ({mounts.source}, {volume.size_mb} MB) in {region}"
            f" on {volume.zone}",
            volume=volume.id,
        )
        return volume.id

    @staticmethod
    def _volume_of(m: MachineView) -> str | None:
        return m.config.mounts[0].volume if m.config.mounts else None

    async def _view(self, mid: str) -> MachineView:
        return MachineView.of(await self.api.machine(self.app, mid))

    async def create(
        self,
        region: str,
        role: Role = "primary",
        primary: MachineView | None = None,
        hidden: bool = False,
    ) -> MachineView:
        """A started primary (or canary), or a stopped standby on another worker than its
        primary's when the region has one. With [mounts], a primary gets a volume of its own
        first, and runs where the volume is."""
        volume = await self._volume(region) if role == "primary" else None
        req = CreateMachineRequest(
            region=region,
            config=self._config(role, primary.id if primary else None, hidden, volume),
            skip_launch=role == "standby",
            lease_ttl=self.leases.ttl,
            avoid_workers=[primary.worker] if primary is not None else [],
        )
        try:
            created = await self.api.create(self.app, req)
        except MachinesApiError as exc:
            if volume is not None:  # the machine that was to mount it never came
                with contextlib.suppress(MachinesApiError):
                    await self.api.destroy_volume(self.app, volume)
            if exc.http_status != 412 or primary is None:
                raise DeployError(
                    f"could not create a {role} in {region}: {exc}", region=region
                ) from None
            self.progress.warn(
                f"no other worker in {region} can take the standby of {primary.id};"
                f" placing it on {primary.worker} too"
            )
            try:
                created = await self.api.create(
                    self.app, req.model_copy(update={"avoid_workers": []})
                )
            except MachinesApiError as exc2:
                raise DeployError(
                    f"could not create a standby in {region}: {exc2}", region=region
                ) from None
        self.leases.adopt(created.id, created.nonce)
        self.created.append(created.id)
        machine = MachineView.of(created)
        self.progress.step(
            f"created {role} {machine.id} in {region} on {machine.worker}",
            machine=machine.id,
            role=role,
        )
        return machine

    async def create_instance(self, region: str, gated: bool, hidden: bool = False) -> Instance:
        primary = await self.create(region, "primary", hidden=hidden)
        if gated:
            primary = await self.gate(primary, 0)
        standby = None
        if self.cfg.standbys and not self.aborted:
            standby = await self.create(region, "standby", primary, hidden=hidden)
        return Instance(region, primary, standby)

    async def update_primary(self, m: MachineView, gated: bool) -> MachineView:
        """New config in place. A machine meant to run (started, failed, or crash-looping
        under the old release) runs the new config and, when gated, must come up healthy; one
        stopped on purpose (autostopped by the proxy) stays stopped."""
        before = await self._view(m.id)
        mark = max((e.id for e in before.events), default=0)
        run = before.state in ("started", "starting", "failed") or crashed_last(before)
        volume = self._volume_of(before)
        if self.cfg.mounts is not None and volume is None:
            raise DeployError(
                f"{m.id} was made without [mounts] and a volume cannot be added on its worker:"
                " scale the app to 0 (or destroy it), then deploy",
                machine=m.id,
            )
        req = UpdateMachineRequest(
            config=self._config("primary", volume=volume if self.cfg.mounts else None),
            current_version=before.instance_id,
        )
        nonce = self.leases.nonce(m.id)
        try:
            updated = MachineView.of(await self.api.update(self.app, m.id, req, nonce))
            if run and before.state not in ("started", "starting"):
                try:
                    await self.api.start(self.app, m.id, nonce)
                except MachinesApiError as exc:
                    if exc.reason != "invalid_state":  # a restart was queued already
                        raise
        except MachinesApiError as exc:
            raise DeployError(f"could not update {m.id}: {exc}", machine=m.id) from None
        self.progress.step(f"updated primary {m.id} in {m.region} ({before.state})", machine=m.id)
        if gated and run:
            return await self.gate(updated, mark)
        return updated

    async def update_standby(self, m: MachineView, primary: MachineView) -> MachineView:
        req = UpdateMachineRequest(config=self._config("standby", primary.id), skip_launch=True)
        try:
            updated = await self.api.update(self.app, m.id, req, self.leases.nonce(m.id))
        except MachinesApiError as exc:
            raise DeployError(f"could not update standby {m.id}: {exc}", machine=m.id) from None
        self.progress.step(f"updated standby {m.id} in {m.region}", machine=m.id)
        return MachineView.of(updated)

    async def relabel(self, m: MachineView, **changes: str | None) -> None:
        """Metadata in place: no new instance, no restart."""
        patch = MetadataPatch(metadata=changes)
        try:
            await self.api.patch_metadata(self.app, m.id, patch, self.leases.nonce(m.id))
        except MachinesApiError as exc:
            raise DeployError(f"could not relabel {m.id}: {exc}", machine=m.id) from None

    async def discard(self, mid: str) -> None:
        """Destroy, by force, and return once it is destroyed; one already gone is fine."""
        try:
            await self.api.destroy(self.app, mid, self.leases.nonce(mid), force=True)
            await self.api.wait(self.app, mid, "destroyed", DESTROY_WAIT)
        except MachinesApiError as exc:
            if exc.http_status != 404:
                raise
        self.leases.forget(mid)

    async def destroy(self, m: MachineView, why: str) -> None:
        try:
            await self.discard(m.id)
        except MachinesApiError as exc:
            raise DeployError(f"could not destroy {m.id}: {exc}", machine=m.id) from None
        self.progress.step(f"destroyed {m.role or 'machine'} {m.id} in {m.region} ({why})")

    async def gate(self, m: MachineView, mark: int) -> MachineView:
        """Until the machine runs the new instance, started, with every check passing (or, with
        no checks, started for `settle` seconds). Fails fast on an exit or failure logged after
        event `mark`; fails at `wait_timeout` otherwise."""
        deadline = time.monotonic() + self.cfg.deploy.wait_timeout
        settle = self.cfg.deploy.settle
        started_at: float | None = None
        names = set(m.config.checks)
        while True:
            if self.aborted:
                raise Aborted(f"stopped waiting for {m.id}: another machine failed")
            now = time.monotonic()
            try:
                current = await self._view(m.id)
            except MachinesApiError as exc:
                raise DeployError(f"lost machine {m.id}: {exc}", machine=m.id) from None
            for e in sorted(current.events, key=lambda e: e.id):
                if e.id <= mark:
                    continue
                if e.type == "exit" and "restart" in e.request:  # not a stop we asked for
                    raise await self._failure(current, e.request.get("exit_code"), e.request)
                if e.step == "error":  # the worker could not run it (e.g. spawn)
                    raise await self._failure(current, None, e.request)
            if current.state in ("destroying", "destroyed"):
                raise DeployError(f"machine {m.id} was destroyed during the deploy")
            # started on the new instance, by a process spawned after `mark`: an update answers
            # with the new instance id while the old process still runs until its restart
            spawns = [
                e.timestamp
                for e in current.events
                if e.id > mark and (e.type, e.step) == ("start", "spawn")
            ]
            up = current.state == "started" and current.instance_id == m.instance_id and spawns
            if up:
                started_at = now if started_at is None else started_at
                passing = {
                    c.name
                    for c in current.checks
                    if c.status == "passing" and _millis(c.updated_at) >= max(spawns)
                }
                if names and names <= passing:
                    self.progress.step(
                        f"{m.id} in {m.region} is healthy ({len(names)} checks passing)",
                        machine=m.id,
                    )
                    return current
                if not names and now - started_at >= settle:
                    self.progress.step(f"{m.id} in {m.region} is started", machine=m.id)
                    return current
            else:
                started_at = None
            if now >= deadline:
                checks = {c.name: f"{c.status}: {c.output}" for c in current.checks}
                raise DeployError(
                    f"machine {m.id} was not healthy within {self.cfg.deploy.wait_timeout:g}s"
                    f" (state {current.state}"
                    + "".join(f"; check {k} {v}" for k, v in checks.items())
                    + ")",
                    machine=m.id,
                    state=current.state,
                    checks=checks,
                )
            await asyncio.sleep(POLL)

    async def _failure(self, m: MachineView, exit_code: Any, data: dict[str, Any]) -> MachineFailed:
        code = exit_code if isinstance(exit_code, int) else None
        stdout, stderr = await asyncio.gather(
            self.api.logs(self.app, m.id, "stdout"),
            self.api.logs(self.app, m.id, "stderr"),
            return_exceptions=True,
        )
        logs = {
            "stdout": _tail(stdout) if isinstance(stdout, str) else [],
            "stderr": _tail(stderr) if isinstance(stderr, str) else [],
        }
        why = f"exited with code {code}" if code is not None else "failed"
        if data.get("error"):
            why += f": {data['error']}"
        return MachineFailed(
            f"machine {m.id} in {m.region} {why}", machine=m.id, exit_code=code, logs=logs
        )
