"""Backend choice and autostop decisions, over a hand-written catalog view (no network)."""

from __future__ import annotations

import random

import pytest

from souk.clients.machines import MachinesClient
from souk.models.machine import MachineConfig
from souk.proxy.idle import Autostop
from souk.proxy.policy import Policies, ServicePolicy, policy_of
from souk.proxy.routing import Loads, Marks, Router, app_of
from tests.support.catalog_view import FakeView

DEAD_BROKER = "http://127.0.0.1:9"


@pytest.mark.parametrize(
    ("host", "header", "app"),
    [
        ("web.souk.local", None, "web"),
        ("web.souk.local:4300", None, "web"),
        ("WEB.Souk.Local.", None, "web"),
        ("a.b.souk.local", None, None),
        ("souk.local", None, None),
        ("web.example.com", None, None),
        ("127.0.0.1:4300", None, None),
        ("[::1]:4300", None, None),
        (None, None, None),
        ("127.0.0.1:4300", "Web", "web"),
        ("other.souk.local", "web", "web"),
    ],
)
def test_app_of(host: str | None, header: str | None, app: str | None) -> None:
    assert app_of(host, header, "souk.local") == app


def make_router(view: FakeView, region: str | None = "mad") -> tuple[Router, Policies, Loads]:
    policies = Policies(MachinesClient(DEAD_BROKER, "t"))
    loads = Loads()
    return Router(view, policies, loads, Marks(), region, random.Random(7)), policies, loads


def known(policies: Policies, view: FakeView, **kw: int | None) -> None:
    for row in view.rows.values():
        policies.put(row.id, row.instance_id, ServicePolicy(**kw))  # type: ignore[arg-type]


async def test_skips_machines_that_must_not_take_traffic() -> None:
    view = FakeView()
    view.add("hidden", metadata={"souk.hidden": "true"})
    view.add("cordoned", metadata={"souk_cordoned": "true"})
    view.add("noport", port=None)
    view.add("noip", ip=None)
    view.add("stopped", state="stopped")
    view.add_worker("dead", "mad", unreachable=True)
    view.add("lost", worker="dead")
    view.add("ok")
    router, policies, loads = make_router(view)
    known(policies, view)
    for _ in range(20):
        choice = router.choose("web")
        assert choice.backend is not None and choice.backend.id == "ok"
        assert [r.id for r in choice.lost] == ["lost"]
        loads.release("ok", "web")
    assert router.choose("web", frozenset({"ok"})).backend is None
    assert router.choose("other").backend is None


async def test_prefers_own_region_then_others() -> None:
    view = FakeView()
    view.add("ams1", region="ams")
    view.add("mad1", region="mad")
    router, policies, _ = make_router(view, region="mad")
    known(policies, view)
    picks = {router.choose("web").backend.id for _ in range(10)}  # type: ignore[union-attr]
    assert picks == {"mad1"}
    picks = {router.choose("web", frozenset({"mad1"})).backend.id for _ in range(5)}  # type: ignore[union-attr]
    assert picks == {"ams1"}


async def test_least_loaded_of_two() -> None:
    view = FakeView()
    view.add("a")
    view.add("b")
    router, policies, loads = make_router(view)
    known(policies, view)
    for _ in range(3):
        loads.acquire("a")
    for _ in range(10):
        choice = router.choose("web")
        assert choice.backend is not None and choice.backend.id == "b"
        loads.release("b", "web")
    # Ten more, kept in flight: the two stay within one request of each other.
    for _ in range(10):
        router.choose("web")
    assert abs(loads.of("a") - loads.of("b")) <= 1


async def test_soft_limit_spills_to_other_regions_then_hard_limit_holds() -> None:
    view = FakeView()
    view.add("mad1", region="mad")
    view.add("ams1", region="ams")
    router, policies, loads = make_router(view)
    known(policies, view, soft_limit=1, hard_limit=2)
    picks = []
    for _ in range(4):
        choice = router.choose("web")
        assert choice.backend is not None
        picks.append((choice.backend.id, choice.over_soft))
    # under soft first (own region, then ams), then under hard (own region first)
    assert picks == [("mad1", False), ("ams1", False), ("mad1", True), ("ams1", True)]
    full = router.choose("web")
    assert full.backend is None and full.serving == 2 and full.over_soft
    loads.release("ams1", "web")
    again = router.choose("web")
    assert again.backend is not None and again.backend.id == "ams1"


async def test_marks_override_the_catalog_for_a_while() -> None:
    view = FakeView()
    view.add("s", state="stopped")
    router, policies, _ = make_router(view)
    known(policies, view)
    assert router.choose("web").backend is None
    router.marks.woke(view.rows["s"])
    assert router.choose("web").backend is not None
    router.marks.set("stopping", "s", 5)
    assert router.choose("web").backend is None
    router.marks.set("stopping", "s", -1)  # expired
    assert router.choose("web").backend is not None


def test_policy_from_service_config() -> None:
    config = MachineConfig.model_validate(
        {
            "init": {"exec": ["x"]},
            "services": [
                {
                    "internal_port": 8080,
                    "autostop": "suspend",
                    "autostart": False,
                    "min_machines_running": 2,
                    "concurrency": {"soft_limit": 3, "hard_limit": 5},
                }
            ],
        }
    )
    assert policy_of(config) == ServicePolicy(3, 5, False, True, 2)
    bare = MachineConfig.model_validate(
        {"init": {"exec": ["x"]}, "services": [{"internal_port": 1}]}
    )
    assert policy_of(bare) == ServicePolicy(None, None, True, False, 0)


def make_autostop(view: FakeView) -> tuple[Autostop, Policies, Loads]:
    router, policies, loads = make_router(view)
    stop = Autostop(router, policies.broker, idle_timeout=0)
    return stop, policies, loads


async def test_autostop_keeps_min_machines_running_per_region() -> None:
    view = FakeView()
    for mid, region in [("m1", "mad"), ("m2", "mad"), ("m3", "mad"), ("a1", "ams")]:
        view.add(mid, region=region)
    view.add("hidden", metadata={"souk.hidden": "true"})
    stop, policies, loads = make_autostop(view)
    known(policies, view, autostop=True, min_machines_running=1)  # type: ignore[arg-type]
    loads.acquire("m1")  # busy: never stopped
    due = {row.id for row in stop.due()}
    assert due == {"m2", "m3"}  # mad keeps one (m1, busy); ams keeps its only one; hidden stays
    assert stop.due() == []  # marked as stopping: not chosen twice
    assert router_refuses(stop, {"m2", "m3"})


def router_refuses(stop: Autostop, ids: set[str]) -> bool:
    for _ in range(20):
        choice = stop.router.choose("web")
        if choice.backend is not None and choice.backend.id in ids:
            return False
    return True


async def test_autostop_only_where_enabled_and_unknown_means_off() -> None:
    view = FakeView()
    view.add("on")
    view.add("off")
    view.add("unknown")
    stop, policies, _ = make_autostop(view)
    policies.put("on", "i-on", ServicePolicy(autostop=True))
    policies.put("off", "i-off", ServicePolicy(autostop=False))
    assert [row.id for row in stop.due()] == ["on"]
    await policies.close()


async def test_a_woken_mark_ends_when_the_catalog_shows_a_newer_row() -> None:
    view = FakeView()
    row = view.add("s", state="stopped")
    router, policies, loads = make_router(view)
    known(policies, view)
    router.marks.woke(row)
    view.rows["s"] = row.model_copy(update={"state": "starting", "updated_at": "2021-01-01"})
    assert router.choose("web").backend is not None  # starting, and started by us
    loads.release("s", "web")
    view.rows["s"] = row.model_copy(update={"state": "stopped", "updated_at": "2022-01-01"})
    assert router.choose("web").backend is None  # stopped since: the catalog wins
    view.rows["s"] = row  # even the old row again (the mark is gone for good)
    assert router.choose("web").backend is None
