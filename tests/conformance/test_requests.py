"""What Fly clients send, accepted as Fly does: app_name, no region, size presets, PUT, and
every config field either honoured or refused by name."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from souk.broker.state import BROKER
from souk.models.machine import SIZES, MachineConfig
from tests.support.broker_cluster import Cluster, WorkerSpec, cluster, machine_body

M = "/v1/apps/demo/machines"
EXEC = {"init": {"exec": ["sleep", "60"]}}


async def body_of(resp: Any, status: int) -> Any:
    assert resp.status == status, await resp.text()
    return await resp.json()


@pytest.fixture
async def lopsided(tmp_path: Path) -> Any:
    """mad has one small worker; ams one with room for more."""
    specs = [WorkerSpec("m1", "mad", cpus=1, memory_mb=1024), WorkerSpec("a1", "ams", cpus=8)]
    async with cluster(tmp_path, specs) as c:
        yield c


def test_size_presets_map_to_flys_guests() -> None:
    got = {n: MachineConfig.model_validate({**EXEC, "size": n}).guest for n in SIZES}
    assert (got["shared-cpu-1x"].cpus, got["shared-cpu-1x"].memory_mb) == (1, 256)
    assert (got["shared-cpu-8x"].cpus, got["shared-cpu-8x"].memory_mb) == (8, 2048)
    perf = got["performance-16x"]
    assert (perf.cpu_kind, perf.cpus, perf.memory_mb) == ("performance", 16, 32768)
    assert got["performance-1x"].memory_mb == 2048
    # the guest's own fields win over the preset's
    mixed = MachineConfig.model_validate({**EXEC, "size": "shared-cpu-4x", "guest": {"cpus": 1}})
    assert (mixed.guest.cpus, mixed.guest.memory_mb) == (1, 1024)
    with pytest.raises(ValueError, match="unknown size"):
        MachineConfig.model_validate({**EXEC, "size": "huge"})


async def test_app_name_as_well_as_name(lopsided: Cluster) -> None:
    c = lopsided
    app = await body_of(await c.call("POST", "/v1/apps", json={"app_name": "older"}), 201)
    assert app["name"] == "older"
    both = {"app_name": "one", "name": "two"}
    body = await body_of(await c.call("POST", "/v1/apps", json=both), 400)
    assert "app_name" in body["error"]
    # a token limited to an app may create it by either field
    token = c.tokens["demo"]
    resp = await c.call("POST", "/v1/apps", token=token, json={"app_name": "other"})
    assert resp.status == 403


async def test_no_region_takes_the_best_offer_of_every_region(lopsided: Cluster) -> None:
    c = lopsided
    body = {"config": {**EXEC, "guest": {"cpus": 2, "memory_mb": 256}}}
    for _ in range(2):  # mad cannot hold 2 cpus: every one goes to ams
        m = await body_of(await c.call("POST", M, json=body), 200)
        assert m["region"] == "ams"
    app = c.broker.app
    assert app is not None
    app[BROKER].default_region = "mad"  # as `souk broker --default-region mad`
    small = {"config": {**EXEC, "size": "shared-cpu-1x"}}
    m = await body_of(await c.call("POST", M, json=small), 200)
    assert (m["region"], m["config"]["guest"]["cpus"]) == ("mad", 1)
    body = await body_of(await c.call("POST", M, json=body), 412)
    assert body["status"] == "insufficient_capacity" and body["details"]["region"] == "mad"


async def test_put_updates_as_post_does(lopsided: Cluster) -> None:
    c = lopsided
    m = await body_of(await c.call("POST", M, json=machine_body(region="ams")), 200)
    update = {"config": {**EXEC, "env": {"V": "1"}}}
    put = await body_of(await c.call("PUT", f"{M}/{m['id']}", json=update), 200)
    assert put["config"]["env"] == {"V": "1"} and put["instance_id"] != m["instance_id"]


UNSUPPORTED: list[tuple[dict[str, Any], str]] = [
    ({"containers": [{"name": "a", "image": "x"}]}, "config.containers"),
    ({"guest": {"kernel_args": ["quiet"]}}, "config.guest.kernel_args"),
    ({"guest": {"gpus": 1, "gpu_kind": "a100-pcie-40gb"}}, "config.guest.gpus"),
    ({"init": {"exec": ["sleep", "1"], "swap_size_mb": 512}}, "config.init.swap_size_mb"),
    ({"init": {"exec": ["sleep", "1"], "kernel_args": ["a"]}}, "config.init.kernel_args"),
    ({"rootfs": {"size_gb": 10}}, "config.rootfs"),
    ({"statics": [{"guest_path": "/s", "url_prefix": "/s"}]}, "config.statics"),
    ({"dns": {"nameservers": ["1.1.1.1"]}}, "config.dns"),
    ({"processes": [{"cmd": ["a"], "user": "www-data"}]}, "config.processes.0.user"),
    (
        {"services": [{"internal_port": 80, "ports": [{"start_port": 1, "end_port": 9}]}]},
        "config.services.0.ports.0.start_port",
    ),
]


@pytest.mark.parametrize(("fields", "named"), UNSUPPORTED)
def test_fields_souk_cannot_honour_are_refused_by_name(fields: dict[str, Any], named: str) -> None:
    from pydantic import ValidationError

    with pytest.raises(ValidationError) as info:
        MachineConfig.model_validate({**EXEC, **fields})
    errors = info.value.errors()
    assert errors[0]["type"] == "unsupported", errors
    assert ".".join(str(p) for p in errors[0]["loc"]).startswith(named.removeprefix("config")[1:])


def test_fields_souk_honours_or_keeps_are_accepted_and_returned() -> None:
    config = MachineConfig.model_validate(
        {
            **EXEC,
            "schedule": "daily",
            "metrics": {"port": 9091, "path": "/metrics"},
            "auto_destroy": True,
            "processes": [{"cmd": ["sleep", "1"], "user": "3", "env": {"A": "1"}}],
            "services": [
                {
                    "internal_port": 8080,
                    "autostop": False,
                    "ports": [{"port": 80, "force_https": True}],
                    "checks": [{"type": "http", "method": "HEAD", "path": "/"}],
                }
            ],
            "checks": {
                "c": {"type": "http", "port": 1, "headers": [{"name": "A", "values": ["b"]}]}
            },
            "dns": {"skip_registration": True},
            "rootfs": {"persist": "never"},
            "disable_machine_autostart": True,
        }
    )
    again = MachineConfig.model_validate_json(config.model_dump_json())
    assert again == config
    assert again.services[0].autostop == "off" and again.services[0].ports[0].force_https
    assert again.processes[0].uid_offset() == 3


async def test_unknown_config_fields_are_ignored_as_fly_does_and_named_back(
    lopsided: Cluster,
) -> None:
    """hyperterse-sandboxer sends `auto_start_machines` and `stop_timeout` in the config: Fly
    ignores them, so souk does, naming each in a header and in the create event."""
    c = lopsided
    config = {
        **EXEC,
        "auto_start_machines": True,
        "stop_timeout": "5s",
        "services": [{"internal_port": 8080, "ports": [{"port": 80, "tls": True}]}],
    }
    resp = await c.call("POST", M, json={"region": "ams", "config": config})
    m = await body_of(resp, 200)
    named = "config.auto_start_machines, config.stop_timeout, config.services.0.ports.0.tls"
    assert resp.headers["souk-ignored-fields"] == named
    assert "auto_start_machines" not in m["config"] and m["config"]["services"][0]["ports"]
    events = await body_of(await c.call("GET", f"{M}/{m['id']}/events"), 200)
    launch = next(e for e in events if e["type"] == "launch")
    assert launch["request"]["ignored_fields"] == named.split(", ")

    plain = await c.call("POST", M, json={"region": "ams", "config": EXEC})
    assert (await body_of(plain, 200)) and "souk-ignored-fields" not in plain.headers
    put = await c.call("PUT", f"{M}/{m['id']}", json={"config": {**EXEC, "stop_timeout": "1s"}})
    await body_of(put, 200)
    assert put.headers["souk-ignored-fields"] == "config.stop_timeout"
    # outside the config, and a field of the wrong type, are still refused
    body = await body_of(await c.call("POST", M, json={"config": EXEC, "regoin": "x"}), 400)
    assert "regoin" in body["error"]
    bad = {"config": {**EXEC, "auto_destroy": "soon"}}
    assert (await c.call("POST", M, json=bad)).status == 400
    many = {"config": {**EXEC, **{f"x{i}": i for i in range(1000)}}, "region": "ams"}
    resp = await c.call("POST", M, json=many)
    await body_of(resp, 200)  # named back, within a header's room
    assert resp.headers["souk-ignored-fields"].endswith("config.x30, and 969 more")


async def test_one_process_on_an_image_machine_is_its_command(lopsided: Cluster) -> None:
    """As simt-fly-machines sends it: the process's command and env run in the image; several
    processes need a guest init (the vm driver's): a region with no worker running them has no
    room for them, and says why."""
    c = lopsided
    process = {"cmd": ["serve", "--port", "8080"], "env": {"MODE": "web"}}
    config = {"image": "r.example/app:1", "env": {"A": "1"}, "processes": [process]}
    m = await body_of(await c.call("POST", M, json={"region": "ams", "config": config}), 200)
    assert m["config"]["init"]["cmd"] == ["serve", "--port", "8080"]
    assert m["config"]["env"] == {"A": "1", "MODE": "web"} and "processes" not in m["config"]
    config["processes"] = [process, {"exec": ["worker"]}]
    body = await body_of(await c.call("POST", M, json={"region": "ams", "config": config}), 412)
    assert body["code"] == "insufficient_capacity"
    assert "runs no processes of images" in str(body["details"])
