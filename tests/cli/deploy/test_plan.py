"""The pure plan: instances from the app's machines, and what a deploy changes to reach its
release. Releases and rollback targets from app metadata."""

from __future__ import annotations

from typing import Any

import pytest

from souk.cli.deploy.config import AppConfig, parse
from souk.cli.deploy.plan import MachineView, fingerprint, plan, sort_fleet
from souk.cli.deploy.releases import (
    CURRENT,
    LOCK,
    AppRecord,
    Release,
    RollbackError,
)
from souk.models.wire import Role


def cfg(greeting: str = "v1", **extra: Any) -> AppConfig:
    return parse(
        {
            "app": "shop",
            "command": ["python3", "app.py"],
            "regions": {"mad": 1},
            "env": {"GREETING": greeting},
            **extra,
        }
    )


_seq = iter(range(10_000))


def machine(
    region: str = "mad",
    role: Role | None = "primary",
    release: int = 1,
    greeting: str = "v1",
    standby_for: str | None = None,
    state: str = "started",
    hidden: bool = False,
    mid: str | None = None,
) -> MachineView:
    n = next(_seq)
    config = cfg(greeting).machine_config(
        release, role or "primary", standby_for, hidden, secrets=digest(greeting)
    )
    if role is None:
        config.metadata.clear()
    return MachineView(
        id=mid or f"m{n:04d}",
        region=region,
        worker=f"{region}1",
        state=state,
        instance_id=f"i{n}",
        config=config,
        created_at=f"2026-01-01T00:00:{n % 60:02d}Z",
    )


def digest(greeting: str) -> str:
    """What the deploy marks a machine with when the app's secrets hold this GREETING."""
    return f"secrets-{greeting}"


def fp(greeting: str = "v1") -> str:
    return fingerprint(cfg(greeting).machine_config(9, "primary", secrets=digest(greeting)))


def instance(region: str = "mad", release: int = 1, greeting: str = "v1") -> list[MachineView]:
    p = machine(region, "primary", release, greeting)
    s = machine(region, "standby", release, greeting, standby_for=p.id, state="stopped")
    return [p, s]


def test_fingerprint_ignores_marks_and_standby_links() -> None:
    a = cfg().machine_config(1, "primary", secrets="d1")
    b = cfg().machine_config(2, "standby", standby_for="x", hidden=True, secrets="d1")
    assert fingerprint(a) == fingerprint(b)
    # Env values are the app's secrets, not the config: their digest tells versions apart.
    assert a.env == {} and cfg("v2").machine_config(1, "primary", secrets="d1") == a
    assert fingerprint(a) != fingerprint(cfg().machine_config(1, "primary", secrets="d2"))
    assert fingerprint(a) != fingerprint(cfg(command=["x"]).machine_config(1, "primary"))


def test_machines_sort_into_instances_leftovers_and_others() -> None:
    p1, s1 = instance()
    p2 = machine()
    extra = machine(role="standby", standby_for=p1.id, state="stopped")  # a second standby
    orphan = machine(role="standby", standby_for="gone", state="stopped")
    canary = machine(role="canary")
    hidden = machine(hidden=True)
    mine = machine(role=None)
    gone = machine(state="destroyed")
    fleet = sort_fleet([orphan, s1, p1, p2, extra, canary, hidden, mine, gone])
    assert [(i.primary.id, i.standby.id if i.standby else None) for i in fleet.instances] == [
        (p1.id, s1.id),
        (p2.id, None),
    ]
    assert {m.id for m in fleet.leftovers} == {extra.id, orphan.id, canary.id, hidden.id}
    assert [m.id for m in fleet.unmanaged] == [mine.id]
    assert fleet.counts() == {"mad": 2}


def test_first_deploy_creates_every_instance() -> None:
    p = plan({"mad": 2, "ams": 1}, fp(), 1, [])
    assert p.create == {"mad": 2, "ams": 1}
    assert p.keep == [] and p.remove == [] and p.updates() == []


def test_a_new_config_updates_and_the_same_config_relabels() -> None:
    old = instance(greeting="v1") + instance("ams", greeting="v2")
    p = plan({"mad": 1, "ams": 1}, fp("v2"), 2, old)
    assert [i.primary.id for i in p.updates()] == [old[0].id]  # mad runs v1
    assert {m.id for i in p.keep for m in i.machines() if p.relabel(m)} == {old[2].id, old[3].id}
    assert p.create == {} and p.remove == []
    summary = p.summary()
    assert summary["update"] == [old[0].id] and summary["standbys_to_create"] == 0


def test_shrinking_removes_the_least_valuable_instances_first() -> None:
    up = instance(greeting="v2")
    outdated = instance(greeting="v1")
    stopped = [machine(greeting="v2", state="stopped")]
    p = plan({"mad": 1}, fp("v2"), 3, up + outdated + stopped)
    assert {i.primary.id for i in p.remove} == {outdated[0].id, stopped[0].id}
    assert [i.primary.id for i in p.keep] == [up[0].id]
    p = plan({}, fp("v2"), 3, up + outdated)  # a region no longer wanted loses everything
    assert p.keep == [] and len(p.remove) == 2


def test_standbys_missing_or_unwanted() -> None:
    lone = machine()
    paired = instance()
    p = plan({"mad": 2}, fp(), 1, [lone, *paired])
    assert [i.primary.id for i in p.missing_standbys()] == [lone.id]
    p = plan({"mad": 2}, fp(), 1, [lone, *paired], standbys=False)
    assert p.missing_standbys() == []
    assert [m.id for m in p.extra_standbys()] == [paired[1].id]


def test_leftovers_and_others_are_reported_not_kept() -> None:
    mine = machine(role=None)
    canary = machine(role="canary")
    p = plan({"mad": 0}, fp(), 1, [mine, canary])
    assert [m.id for m in p.leftovers] == [canary.id]
    assert [m.id for m in p.unmanaged] == [mine.id]


def test_max_unavailable_counts_and_fractions() -> None:
    assert cfg(deploy={"max_unavailable": 3}).deploy.batch_size(10) == 3
    assert cfg(deploy={"max_unavailable": 0.25}).deploy.batch_size(10) == 3
    assert cfg(deploy={"max_unavailable": 0.01}).deploy.batch_size(10) == 1


def record(version: int, status: str = "complete") -> tuple[str, str]:
    rel = Release(
        version=version,
        status=status,  # type: ignore[arg-type]
        strategy="rolling",
        command=["x"],
        config={"app": "shop"},
        created_at="t",
    )
    return rel.key(), rel.encode()


def test_releases_are_numbered_and_listed_newest_first() -> None:
    meta = dict([record(1), record(2), record(10, "failed")])
    meta[CURRENT] = "2"
    meta["release.notes"] = "not a release"
    meta["release.3"] = "{broken"
    assert [r.version for r in AppRecord.of(meta).releases] == [10, 2, 1]
    assert AppRecord.of(meta).current == 2
    assert AppRecord.of(meta).next_version() == 11
    assert AppRecord.of({}).next_version() == 1
    many = dict(record(n) for n in range(1, 151))
    assert sorted(AppRecord.of(many).stale(151), key=len) == [f"release.{n}" for n in range(1, 52)]


def test_rollback_targets() -> None:
    meta = dict([record(1), record(2, "failed"), record(3)])
    meta[CURRENT] = "3"
    assert (
        AppRecord.of(meta).rollback_target().version == 1
    )  # the newest completed before the current
    assert AppRecord.of(meta).rollback_target(2).version == 2
    with pytest.raises(RollbackError, match="no release 9"):
        AppRecord.of(meta).rollback_target(9)
    meta.update([record(4, "failed")])  # a failed deploy left machines half way: repair
    assert AppRecord.of(meta).rollback_target().version == 3
    with pytest.raises(RollbackError, match="nothing to roll back"):
        AppRecord.of(dict([record(1, "failed")])).rollback_target()
    only = dict([record(1)])
    only[CURRENT] = "1"
    with pytest.raises(RollbackError, match="no completed release before"):
        AppRecord.of(only).rollback_target()


def test_an_expired_or_garbled_lock_is_no_lock() -> None:
    assert AppRecord.of({LOCK: '{"owner": "a", "release": 3, "expires_at": 1}'}).lock is None
    assert AppRecord.of({LOCK: "nonsense"}).lock is None
    held = AppRecord.of({LOCK: '{"owner": "a", "release": 3, "expires_at": 4102444800}'}).lock
    assert held is not None and held.release == 3
