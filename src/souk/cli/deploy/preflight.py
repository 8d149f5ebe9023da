"""What a deploy checks before it makes anything: every region it names is one of the cluster's,
and each region the app has no machines in yet can take the machines it asks for there. Found
later, a typo in one region would leave machines created in the others (and the app made) before
the refusal. The image is checked next, by pinning it (`images.pin`), before any machine is
made; an app this deploy just created is removed again when that fails."""

from __future__ import annotations

from souk.cli.deploy.config import AppConfig
from souk.cli.deploy.errors import DeployError
from souk.clients.machines import MachinesClient


async def check(
    api: MachinesClient, cfg: AppConfig, counts: dict[str, int], present: set[str]
) -> None:
    """Raise a DeployError naming every problem of the plan at once. `present`: the regions
    where the app has machines already (updated in place: no new room needed there)."""
    known = {r.code: r for r in (await api.regions(cfg.guest)).regions}
    wanted = {region: n for region, n in counts.items() if n > 0}
    problems: list[str] = []
    unknown = sorted(set(wanted) - set(known))
    if unknown:
        names = ", ".join(sorted(known)) or "none"
        problems += [
            f"regions: no region {r!r} in this cluster (its regions: {names})" for r in unknown
        ]
    per_instance = 2 if cfg.standbys else 1
    guest = cfg.guest
    for region, n in sorted(wanted.items()):
        if region in unknown or region in present:
            continue
        need, room = n * per_instance, known[region].capacity
        if room < need:
            what = f"{n} instance(s)" + (" and their standbys" if per_instance == 2 else "")
            problems.append(
                f"regions.{region}: room for {room} machine(s) of {guest.cpus} {guest.cpu_kind}"
                f" cpu(s), {guest.memory_mb} MB now; {what} need {need}"
            )
    if problems:
        raise DeployError(
            "the plan cannot be deployed; nothing was changed:\n  " + "\n  ".join(problems),
            problems=problems,
        )
