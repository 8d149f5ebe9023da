"""Carrying out a plan through the Machines API: leases, the health gate, and the four
strategies (rolling, immediate, canary, bluegreen).

Every machine a deploy touches is leased first (created machines come with their lease), the
leases are refreshed in the background while it works and released at the end, so a second
deploy of the same app is refused at its first lease. A machine that exits or fails while the
deploy waits for it stops the deploy at once, with its exit code and last log lines.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import json
import secrets
import time
from collections.abc import Awaitable, Callable, Iterable
from dataclasses import dataclass, field
from datetime import datetime
from types import TracebackType
from typing import Any

from rich.console import Console

from souk.cli.deploy.client import Api, ApiError
from souk.cli.deploy.config import HIDDEN, RELEASE, AppConfig, StrategyName
from souk.cli.deploy.plan import Instance, MachineView, Plan, fingerprint, plan, sort_fleet
from souk.cli.deploy.releases import (
    CURRENT,
    LOCK,
    Lock,
    Release,
    lock_of,
    next_version,
    now_iso,
    stale_releases,
)

LEASE_TTL = 30
POLL = 0.2
LOG_LINES = 15


class DeployError(Exception):
    """A deploy stopped; `details` says why, for --json."""

    def __init__(self, message: str, **details: Any) -> None:
        super().__init__(message)
        self.message = message
        self.details = details


class DeployInProgress(DeployError):
    pass


class MachineFailed(DeployError):
    pass


class Aborted(DeployError):
    """Another job of the same batch failed first."""


class Progress:
    """Steps as they happen, on stderr (Rich); kept as a list for --json."""

    def __init__(self, quiet: bool = False, console: Console | None = None) -> None:
        self.quiet = quiet
        self.console = console or Console(stderr=True, highlight=False)
        self.started = time.monotonic()
        self.events: list[dict[str, Any]] = []

    def step(self, text: str, **data: Any) -> None:
        elapsed = time.monotonic() - self.started
        self.events.append({"t": round(elapsed, 3), "step": text, **data})
        if not self.quiet:
            self.console.print(f"[dim]{elapsed:6.1f}s[/dim] {text}")

    def warn(self, text: str) -> None:
        self.events.append({"t": round(time.monotonic() - self.started, 3), "warning": text})
        if not self.quiet:
            self.console.print(f"[yellow]warning:[/yellow] {text}")


class Leases:
    """The deploy's leases: acquired before a change, refreshed while working, released at
    the end. Also keeps the app's advisory `deploy.lock` fresh."""

    def __init__(self, api: Api, app: str, description: str, ttl: int = LEASE_TTL) -> None:
        self.api = api
        self.app = app
        self.description = description
        self.ttl = ttl
        self.owner = secrets.token_hex(8)
        self.release = 0
        self.nonces: dict[str, str] = {}
        self._locked = False
        self._task: asyncio.Task[None] | None = None

    async def __aenter__(self) -> Leases:
        self._task = asyncio.create_task(self._refresh_forever())
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await asyncio.gather(
            *(self._release(mid, nonce) for mid, nonce in self.nonces.items()),
            return_exceptions=True,
        )
        self.nonces.clear()
        if self._locked:
            with contextlib.suppress(ApiError):
                meta = await self.api.app_metadata(self.app)
                held = lock_of(meta)
                if held is None or held.owner == self.owner:
                    await self.api.patch_app_metadata(self.app, delete=[LOCK])

    async def lock_app(self, release: int) -> None:
        """Take the app's advisory lock, unless another live deploy holds it."""
        meta = await self.api.app_metadata(self.app)
        held = lock_of(meta)
        if held is not None and held.owner != self.owner:
            raise DeployInProgress(
                f"deploy in progress: release {held.release} of {self.app} is being deployed",
                release=held.release,
            )
        self.release = release
        await self._write_lock()
        self._locked = True
        held = lock_of(await self.api.app_metadata(self.app))
        if held is not None and held.owner != self.owner:
            self._locked = False
            raise DeployInProgress(
                f"deploy in progress: release {held.release} of {self.app} is being deployed",
                release=held.release,
            )

    async def _write_lock(self) -> None:
        lock = Lock(owner=self.owner, release=self.release, expires_at=time.time() + self.ttl)
        await self.api.patch_app_metadata(self.app, {LOCK: lock.model_dump_json()})

    async def acquire(self, ids: Iterable[str]) -> None:
        """Lease every machine, in id order, the first alone: of two deploys starting at once,
        exactly one gets the first lease and the other stops there."""
        todo = sorted(set(ids) - set(self.nonces))
        if not todo:
            return
        await self._acquire_one(todo[0])
        results = await asyncio.gather(
            *(self._acquire_one(mid) for mid in todo[1:]), return_exceptions=True
        )
        for result in results:
            if isinstance(result, BaseException):
                raise result

    async def _acquire_one(self, mid: str) -> None:
        try:
            lease = await self.api.lease(self.app, mid, self.ttl, self.description)
        except ApiError as exc:
            if exc.reason != "lease_held":
                raise
            held = await self.api.get_lease(self.app, mid)
            what = f" ({held['description']})" if held and held.get("description") else ""
            raise DeployInProgress(
                f"deploy in progress: machine {mid} of {self.app} is leased{what}",
                machine=mid,
                lease=held,
            ) from None
        self.nonces[mid] = str(lease["nonce"])

    def adopt(self, mid: str, nonce: str | None) -> None:
        if nonce:
            self.nonces[mid] = nonce

    def nonce(self, mid: str) -> str | None:
        return self.nonces.get(mid)

    def forget(self, mid: str) -> None:
        self.nonces.pop(mid, None)

    async def _release(self, mid: str, nonce: str) -> None:
        with contextlib.suppress(ApiError):
            await self.api.release_lease(self.app, mid, nonce)

    async def _refresh_forever(self) -> None:
        while True:
            await asyncio.sleep(self.ttl / 3)
            for mid, nonce in list(self.nonces.items()):
                with contextlib.suppress(ApiError):
                    await self.api.lease(self.app, mid, self.ttl, self.description, nonce)
            if self._locked:
                with contextlib.suppress(ApiError):
                    await self._write_lock()


def crashed_last(m: MachineView) -> bool:
    """Whether the machine's last exit was a crash rather than a stop that was asked for."""
    for e in sorted(m.events, key=lambda e: e.id, reverse=True):
        if e.type == "event.exit":
            return "restart" in e.request
        if e.type.startswith("stop."):
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

    api: Api
    cfg: AppConfig
    release: int
    progress: Progress
    leases: Leases
    fp: str = ""
    created: list[str] = field(default_factory=list)
    aborted: bool = False

    def __post_init__(self) -> None:
        self.fp = fingerprint(self.cfg.machine_config(self.release, "primary"))

    @property
    def app(self) -> str:
        return self.cfg.app

    def _config(
        self, role: str, standby_for: str | None = None, hidden: bool = False
    ) -> dict[str, Any]:
        config = self.cfg.machine_config(self.release, role, standby_for, hidden)
        return config.model_dump(mode="json", exclude_none=True)

    async def _view(self, mid: str) -> MachineView:
        return MachineView.model_validate(await self.api.machine(self.app, mid))

    async def create(
        self,
        region: str,
        role: str = "primary",
        primary: MachineView | None = None,
        hidden: bool = False,
    ) -> MachineView:
        """A started primary (or canary), or a stopped standby on another worker than its
        primary's when the region has one."""
        standby = role == "standby"
        body: dict[str, Any] = {
            "region": region,
            "config": self._config(role, primary.id if primary else None, hidden),
            "skip_launch": standby,
            "lease_ttl": self.leases.ttl,
        }
        if primary is not None:
            body["avoid_workers"] = [primary.worker]
        try:
            data = await self.api.create(self.app, body)
        except ApiError as exc:
            if exc.http_status != 412 or primary is None:
                raise DeployError(
                    f"could not create a {role} in {region}: {exc}", region=region
                ) from None
            self.progress.warn(
                f"no other worker in {region} can take the standby of {primary.id};"
                f" placing it on {primary.worker} too"
            )
            body.pop("avoid_workers")
            try:
                data = await self.api.create(self.app, body)
            except ApiError as exc2:
                raise DeployError(
                    f"could not create a standby in {region}: {exc2}", region=region
                ) from None
        self.leases.adopt(data["id"], data.get("nonce"))
        self.created.append(data["id"])
        machine = MachineView.model_validate(data)
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
        if self.cfg.deploy.standbys and not self.aborted:
            standby = await self.create(region, "standby", primary, hidden=hidden)
        return Instance(region, primary, standby)

    async def update_primary(self, m: MachineView, gated: bool) -> MachineView:
        """New config in place. A machine meant to run (started, failed, or crash-looping
        under the old release) runs the new config and, when gated, must come up healthy; one
        stopped on purpose (autostopped by the proxy) stays stopped."""
        before = await self._view(m.id)
        mark = max((e.id for e in before.events), default=0)
        run = before.state in ("started", "starting", "failed") or crashed_last(before)
        body = {"config": self._config("primary"), "current_version": before.instance_id}
        nonce = self.leases.nonce(m.id)
        try:
            data = await self.api.update(self.app, m.id, body, nonce)
            if run and before.state not in ("started", "starting"):
                try:
                    await self.api.action(self.app, m.id, "start", nonce)
                except ApiError as exc:
                    if exc.reason != "invalid_state":  # a restart was queued already
                        raise
        except ApiError as exc:
            raise DeployError(f"could not update {m.id}: {exc}", machine=m.id) from None
        updated = MachineView.model_validate(data)
        self.progress.step(f"updated primary {m.id} in {m.region} ({before.state})", machine=m.id)
        if gated and run:
            return await self.gate(updated, mark)
        return updated

    async def update_standby(self, m: MachineView, primary: MachineView) -> MachineView:
        body = {"config": self._config("standby", primary.id), "skip_launch": True}
        try:
            data = await self.api.update(self.app, m.id, body, self.leases.nonce(m.id))
        except ApiError as exc:
            raise DeployError(f"could not update standby {m.id}: {exc}", machine=m.id) from None
        self.progress.step(f"updated standby {m.id} in {m.region}", machine=m.id)
        return MachineView.model_validate(data)

    async def relabel(self, m: MachineView, **changes: str | None) -> None:
        """Metadata in place: no new instance, no restart."""
        try:
            await self.api.patch_metadata(self.app, m.id, changes, self.leases.nonce(m.id))
        except ApiError as exc:
            raise DeployError(f"could not relabel {m.id}: {exc}", machine=m.id) from None

    async def destroy(self, m: MachineView, why: str) -> None:
        try:
            await self.api.destroy(self.app, m.id, self.leases.nonce(m.id))
        except ApiError as exc:
            raise DeployError(f"could not destroy {m.id}: {exc}", machine=m.id) from None
        self.leases.forget(m.id)
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
            except ApiError as exc:
                raise DeployError(f"lost machine {m.id}: {exc}", machine=m.id) from None
            for e in sorted(current.events, key=lambda e: e.id):
                if e.id <= mark:
                    continue
                if e.type == "event.exit" and "restart" in e.request:  # not a stop we asked for
                    raise await self._failure(current, e.request.get("exit_code"), e.request)
                if e.type.endswith(".error"):  # the worker could not run it (e.g. spawn)
                    raise await self._failure(current, None, e.request)
            if current.state in ("destroying", "destroyed"):
                raise DeployError(f"machine {m.id} was destroyed during the deploy")
            # started on the new instance, by a process spawned after `mark`: an update answers
            # with the new instance id while the old process still runs until its restart
            spawns = [
                e.timestamp for e in current.events if e.id > mark and e.type == "start.spawn"
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


# --- strategies -----------------------------------------------------------------------------


async def _all(d: Deployer, jobs: Iterable[Awaitable[Any]]) -> list[Any]:
    """Run together. The first failure makes the others stop waiting (gates give up), but a
    create or update already sent is let finish, so that no machine is made and forgotten."""

    async def guard(job: Awaitable[Any]) -> Any:
        try:
            return await job
        except BaseException:
            d.aborted = True
            raise

    results = await asyncio.gather(*(guard(j) for j in jobs), return_exceptions=True)
    errors = [r for r in results if isinstance(r, BaseException)]
    if errors:
        errors.sort(key=lambda e: isinstance(e, Aborted))
        raise errors[0]
    return results


async def _reconcile(d: Deployer, p: Plan) -> None:
    """Cheap changes first, together: leftovers, shrunk regions and unwanted standbys go,
    up-to-date machines get this release's marks."""
    doomed = [(m, "leftover") for m in p.leftovers]
    doomed += [(m, "scaled down") for inst in p.remove for m in inst.machines()]
    doomed += [(m, "standbys off") for m in p.extra_standbys()]
    await _all(d, [d.destroy(m, why) for m, why in doomed])
    relabels = [m for inst in p.keep for m in inst.machines() if p.relabel(m)]
    await _all(d, [d.relabel(m, **{RELEASE: str(d.release)}) for m in relabels])
    if relabels:
        d.progress.step(f"marked {len(relabels)} up-to-date machines as release {d.release}")


async def _finish_instance(d: Deployer, p: Plan, inst: Instance, primary: MachineView) -> None:
    """After its primary: the standby follows it (updated in place, or created)."""
    if not p.standbys:
        return
    if inst.standby is None:
        await d.create(inst.region, "standby", primary)
    elif p.outdated(inst.standby) or inst.standby.standby_for != primary.id:
        await d.update_standby(inst.standby, primary)


async def _roll(d: Deployer, p: Plan, inst: Instance, gated: bool) -> None:
    primary = inst.primary
    if p.outdated(primary):
        primary = await d.update_primary(primary, gated)
    await _finish_instance(d, p, inst, primary)


def _units(
    d: Deployer, p: Plan, gated: bool, updates: bool = True
) -> list[Callable[[], Awaitable[Any]]]:
    """New instances first (a broken release then fails before any old machine is touched),
    then the instances to update."""
    units: list[Callable[[], Awaitable[Any]]] = []
    for region, n in sorted(p.create.items()):
        units += [functools.partial(d.create_instance, region, gated)] * n
    for inst in p.updates() if updates else []:
        units.append(functools.partial(_roll, d, p, inst, gated))
    return units


async def _rest(d: Deployer, p: Plan) -> None:
    """Instances whose primary is current but whose standby is missing or outdated."""
    todo = [i for i in p.keep if not p.outdated(i.primary)]
    await _all(d, [_finish_instance(d, p, i, i.primary) for i in todo])


async def rolling(d: Deployer, p: Plan, updates: bool = True) -> None:
    units = _units(d, p, gated=True, updates=updates)
    total = sum(p.create.values()) + len(p.keep)
    size = d.cfg.deploy.batch_size(total)
    batches = [units[:1]] + [units[i : i + size] for i in range(1, len(units), size)]
    for n, batch in enumerate(b for b in batches if b):
        if len(units) > 1:
            d.progress.step(f"batch {n + 1}: {len(batch)} machine(s)")
        await _all(d, [unit() for unit in batch])
    await _rest(d, p)


async def immediate(d: Deployer, p: Plan) -> None:
    await _all(d, [unit() for unit in _units(d, p, gated=False)])
    await _rest(d, p)


async def canary(d: Deployer, p: Plan) -> None:
    if p.create or p.updates():
        region = sorted(p.create)[0] if p.create else p.updates()[0].region
        d.progress.step(f"canary in {region}")
        machine = await d.create(region, "canary")
        try:
            await d.gate(machine, 0)
        finally:
            await d.destroy(machine, "canary done")
    await rolling(d, p)


async def bluegreen(d: Deployer, p: Plan) -> None:
    """A whole new set beside the old, hidden from the proxy until every primary is healthy;
    then revealed, and the old set cordoned, stopped and destroyed. If the new set fails, it
    is destroyed and the old one never stopped serving."""
    if not p.create and not p.updates() and not p.remove:
        await _reconcile(d, p)
        await _rest(d, p)
        return
    counts: dict[str, int] = {}
    for inst in p.keep:
        counts[inst.region] = counts.get(inst.region, 0) + 1
    for region, n in p.create.items():
        counts[region] = counts.get(region, 0) + n
    green: list[Instance] = []

    async def one(region: str) -> None:
        green.append(await d.create_instance(region, gated=True, hidden=True))

    d.progress.step(f"green: {sum(counts.values())} new instance(s), hidden from the proxy")
    try:
        await _all(d, [one(region) for region, n in sorted(counts.items()) for _ in range(n)])
    except BaseException:
        d.progress.step("green failed: destroying the new machines (rollback)")
        new = list(d.created)
        await asyncio.gather(
            *(d.api.destroy(d.app, mid, d.leases.nonce(mid)) for mid in new),
            return_exceptions=True,
        )
        for mid in new:
            d.leases.forget(mid)
        raise
    for inst in green:
        await _all(d, [d.relabel(m, **{HIDDEN: None}) for m in inst.machines()])
    d.progress.step("green revealed: the proxy routes to the new machines")
    blue = [m for inst in p.keep + p.remove for m in inst.machines()] + list(p.leftovers)

    async def retire(m: MachineView) -> None:
        nonce = d.leases.nonce(m.id)
        with contextlib.suppress(ApiError):
            await d.api.action(d.app, m.id, "cordon", nonce)
            if m.state in ("started", "starting"):
                await d.api.action(d.app, m.id, "stop", nonce)
        await d.destroy(m, "blue retired")

    await _all(d, [retire(m) for m in blue])


STRATEGIES: dict[StrategyName, Callable[[Deployer, Plan], Awaitable[None]]] = {
    "rolling": rolling,
    "immediate": immediate,
    "canary": canary,
    "bluegreen": bluegreen,
}


# --- a whole deploy --------------------------------------------------------------------------


@dataclass
class Outcome:
    app: str
    release: int
    strategy: str
    plan: dict[str, Any]
    machines: list[dict[str, Any]]

    def to_json(self) -> dict[str, Any]:
        return {
            "ok": True,
            "app": self.app,
            "release": self.release,
            "strategy": self.strategy,
            "plan": self.plan,
            "machines": self.machines,
        }


def machine_row(m: MachineView) -> dict[str, Any]:
    return {
        "id": m.id,
        "region": m.region,
        "worker": m.worker,
        "state": m.state,
        "role": m.role or "",
        "release": m.release,
        "health": m.health(),
        "hidden": m.hidden,
        "standby_for": m.standby_for,
    }


async def views(api: Api, app: str) -> list[MachineView]:
    return [MachineView.model_validate(m) for m in await api.machines(app)]


async def deploy(
    api: Api,
    cfg: AppConfig,
    progress: Progress,
    strategy: StrategyName | None = None,
    description: str = "",
    counts: dict[str, int] | None = None,
    release: int | None = None,
) -> Outcome:
    """Take the app to `cfg` as a new numbered release (or, with `release` given, reconcile
    its instance counts to `counts` on that existing release: `souk scale`)."""
    app = cfg.app
    chosen: StrategyName = strategy or cfg.deploy.strategy
    if await api.ensure_app(app):
        progress.step(f"created app {app}")
    meta = await api.app_metadata(app)
    new_release = release is None
    number = next_version(meta) if release is None else release
    leases = Leases(api, app, f"souk deploy {app} release {number}")
    async with leases:
        await leases.lock_app(number)
        current = await views(api, app)
        fleet = sort_fleet(current)
        await leases.acquire(m.id for m in fleet.managed())
        progress.step(
            f"leased {len(leases.nonces)} machine(s) of {app}", machines=len(leases.nonces)
        )
        current = await views(api, app)  # as of holding the leases
        record = Release(
            version=number,
            strategy=chosen,
            image=cfg.image,
            command=cfg.command,
            config=cfg.model_dump(mode="json"),
            description=description,
            created_at=now_iso(),
        )
        if new_release:
            meta = await api.app_metadata(app)
            if f"release.{number}" in meta:
                raise DeployInProgress(f"deploy in progress: release {number} appeared meanwhile")
            old = stale_releases(meta, number)
            await api.patch_app_metadata(app, {record.key(): record.encode()}, old)
        d = Deployer(api, cfg, number, progress, leases)
        desired = counts if counts is not None else dict(cfg.regions)
        the_plan = plan(desired, d.fp, number, current, cfg.deploy.standbys)
        await leases.acquire(m.id for m in sort_fleet(current).managed())
        summary = the_plan.summary()
        progress.step(
            f"release {number} ({chosen if new_release else 'scale'}):"
            f" {len(the_plan.updates()) if new_release else 0} to update,"
            f" {sum(the_plan.create.values())} to create,"
            f" {len(summary['remove'])} to remove",
            plan=summary,
        )
        try:
            if not new_release:  # scale: instances come and go, nothing is updated
                await _reconcile(d, the_plan)
                await rolling(d, the_plan, updates=False)
            else:
                if chosen != "bluegreen":
                    await _reconcile(d, the_plan)
                await STRATEGIES[chosen](d, the_plan)
        except DeployError as exc:
            if new_release:
                await _finish(api, record, "failed", exc.message)
            raise
        except BaseException as exc:
            if new_release:
                with contextlib.suppress(Exception):
                    await _finish(api, record, "failed", str(exc) or type(exc).__name__)
            raise
        if new_release:
            await _finish(api, record, "complete")
        final = await views(api, app)
    progress.step(f"release {number} of {app} is deployed" if new_release else f"{app} scaled")
    return Outcome(
        app, number, chosen, summary, [machine_row(m) for m in sort_fleet(final).managed()]
    )


async def _finish(api: Api, record: Release, status: str, error: str | None = None) -> None:
    done = record.model_copy(update={"status": status, "finished_at": now_iso(), "error": error})
    changes = {record.key(): done.encode()}
    if status == "complete":
        changes[CURRENT] = str(record.version)
    await api.patch_app_metadata(_app_of(record), changes)


def _app_of(record: Release) -> str:
    return str(record.config["app"])


def describe(exc: DeployError) -> dict[str, Any]:
    return {"ok": False, "error": exc.message, **json.loads(json.dumps(exc.details, default=str))}
