"""A whole deploy: the app's lock and leases, a new numbered release recorded, the plan, the
chosen strategy, and the release marked complete or failed."""

from __future__ import annotations

import contextlib

from souk.cli.deploy import preflight
from souk.cli.deploy.build import build_and_push
from souk.cli.deploy.config import AppConfig, StrategyName
from souk.cli.deploy.deployer import Deployer
from souk.cli.deploy.errors import DeployError, DeployInProgress
from souk.cli.deploy.images import pin
from souk.cli.deploy.leases import Leases
from souk.cli.deploy.output import Outcome, machine_row
from souk.cli.deploy.plan import MachineView, plan, sort_fleet
from souk.cli.deploy.progress import Progress
from souk.cli.deploy.releases import CURRENT, AppRecord, Release, now_iso, recorded
from souk.cli.deploy.secrets import current_digest, sync_env
from souk.cli.deploy.strategies import STRATEGIES, reconcile, rolling
from souk.clients.machines import MachinesApiError, MachinesClient
from souk.models.machine import MetadataChange


async def views(api: MachinesClient, app: str) -> list[MachineView]:
    return [MachineView.of(m) for m in await api.machines(app)]


async def deploy(
    api: MachinesClient,
    cfg: AppConfig,
    progress: Progress,
    strategy: StrategyName | None = None,
    description: str = "",
    counts: dict[str, int] | None = None,
    release: int | None = None,
    keep_secrets: bool = False,
) -> Outcome:
    """Take the app to `cfg` as a new numbered release (or, with `release` given, reconcile
    its instance counts to `counts` on that existing release: `souk scale`). Its env is set as
    the app's secrets first, unless `keep_secrets` (a rollback to a release whose env is in
    them already, or a scale): then they stay as they are."""
    app = cfg.app
    chosen: StrategyName = strategy or cfg.deploy.strategy
    desired = counts if counts is not None else dict(cfg.regions)
    exists = await api.app_exists(app)
    present = {m.region for m in await views(api, app)} if exists else set()
    await preflight.check(api, cfg, desired, present)
    if cfg.build is not None:  # a Dockerfile: built and pushed first, then deployed pinned
        cfg = await build_and_push(cfg, progress)
    created = await api.ensure_app(app)
    if created:
        progress.step(f"created app {app}")
    known = await AppRecord.read(api, app)
    new_release = release is None
    number = known.next_version() if release is None else release
    # A scale runs its release's image, pinned when the release was recorded; a new release's
    # is pinned before anything else changes, so that a bad image stops the deploy first.
    try:
        image = await pin(api, cfg, known, progress) if new_release else cfg.image
    except DeployError:
        if created:  # nothing else was made: leave no empty app behind
            with contextlib.suppress(MachinesApiError):
                await api.delete_app(app)
        raise
    leases = Leases(api, app, f"souk deploy {app} release {number}")
    async with leases.kept():
        await leases.lock_app(number)
        current = await views(api, app)
        fleet = sort_fleet(current)
        await leases.acquire(m.id for m in fleet.managed())
        progress.step(
            f"leased {len(leases.nonces)} machine(s) of {app}", machines=len(leases.nonces)
        )
        current = await views(api, app)  # as of holding the leases
        record = Release.of(cfg, number, chosen, description, image)
        cfg = cfg.model_copy(update={"image": image})
        if new_release:
            known = await AppRecord.read(api, app)  # as of holding the lock
            if known.holds(record):
                raise DeployInProgress(f"deploy in progress: release {number} appeared meanwhile")
        if new_release and not keep_secrets:
            digest = await sync_env(api, app, cfg.env, known)
        else:  # the env the current release set stays, and stays its to unset later
            digest = await current_digest(api, app)
            record = record.model_copy(update={"env": sorted(known.managed_names())})
        if new_release:
            change = MetadataChange(set=recorded(record), delete=known.stale(number))
            await api.patch_app_metadata(app, change)
        d = Deployer(api, cfg, number, progress, leases, secrets=digest)
        the_plan = plan(desired, d.fp, number, current, cfg.standbys)
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
                await reconcile(d, the_plan)
                await rolling(d, the_plan, updates=False)
            else:
                if chosen != "bluegreen":
                    await reconcile(d, the_plan)
                await STRATEGIES[chosen](d, the_plan)
        except DeployError as exc:
            if new_release:
                await _finish(api, app, record, "failed", exc.message)
            raise
        except BaseException as exc:
            if new_release:
                with contextlib.suppress(Exception):
                    await _finish(api, app, record, "failed", str(exc) or type(exc).__name__)
            raise
        if new_release:
            await _finish(api, app, record, "complete")
        final = await views(api, app)
    progress.step(f"release {number} of {app} is deployed" if new_release else f"{app} scaled")
    return Outcome(
        app, number, chosen, summary, [machine_row(m) for m in sort_fleet(final).managed()]
    )


async def _finish(
    api: MachinesClient, app: str, record: Release, status: str, error: str | None = None
) -> None:
    done = record.model_copy(update={"status": status, "finished_at": now_iso(), "error": error})
    changes = {record.key(): done.encode()}
    if status == "complete":
        changes[CURRENT] = str(record.version)
    await api.patch_app_metadata(app, MetadataChange(set=changes))
