"""The four ways a plan is rolled out: rolling, immediate, canary, bluegreen."""

from __future__ import annotations

import asyncio
import contextlib
import functools
from collections.abc import Awaitable, Callable, Iterable
from typing import Any

from souk.cli.deploy.config import StrategyName
from souk.cli.deploy.deployer import Deployer
from souk.cli.deploy.errors import Aborted
from souk.cli.deploy.plan import Instance, MachineView, Plan
from souk.clients.machines import MachinesApiError
from souk.models.wire import HIDDEN_KEY, RELEASE_KEY


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


async def reconcile(d: Deployer, p: Plan) -> None:
    """Cheap changes first, together: leftovers, shrunk regions and unwanted standbys go,
    up-to-date machines get this release's marks."""
    doomed = [(m, "leftover") for m in p.leftovers]
    doomed += [(m, "scaled down") for inst in p.remove for m in inst.machines()]
    doomed += [(m, "standbys off") for m in p.extra_standbys()]
    await _all(d, [d.destroy(m, why) for m, why in doomed])
    relabels = [m for inst in p.keep for m in inst.machines() if p.relabel(m)]
    await _all(d, [d.relabel(m, **{RELEASE_KEY: str(d.release)}) for m in relabels])
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
        await reconcile(d, p)
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
        await asyncio.gather(*(d.discard(mid) for mid in new), return_exceptions=True)
        for mid in new:
            d.leases.forget(mid)
        raise
    for inst in green:
        await _all(d, [d.relabel(m, **{HIDDEN_KEY: None}) for m in inst.machines()])
    d.progress.step("green revealed: the proxy routes to the new machines")
    blue = [m for inst in p.keep + p.remove for m in inst.machines()] + list(p.leftovers)

    async def retire(m: MachineView) -> None:
        nonce = d.leases.nonce(m.id)
        with contextlib.suppress(MachinesApiError):
            await d.api.cordon(d.app, m.id, nonce)
            if m.state in ("started", "starting"):
                await d.api.stop(d.app, m.id, nonce=nonce)
        await d.destroy(m, "blue retired")

    await _all(d, [retire(m) for m in blue])


STRATEGIES: dict[StrategyName, Callable[[Deployer, Plan], Awaitable[None]]] = {
    "rolling": rolling,
    "immediate": immediate,
    "canary": canary,
    "bluegreen": bluegreen,
}
