"""Fly's routes beyond create/get/stop, through a broker to real workers: suspend and resume,
signal, exec, ps, versions, an organisation's machines, regions with capacity, the placement
quote, the current token and deploy tokens."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from tests.broker.test_api import err, ok
from tests.support.broker_cluster import Cluster, WorkerSpec, cluster, machine_body

APPS = "/v1/apps/demo/machines"
SPECS = [
    WorkerSpec("m1", "mad", driver="process"),
    WorkerSpec("a1", "ams", cpus=2, memory_mb=2048),
    WorkerSpec("a2", "ams", cpus=2, memory_mb=2048),
]
SIM = [WorkerSpec("m1", "mad"), WorkerSpec("a1", "ams")]  # machines that run nothing


async def machine(c: Cluster, region: str = "mad", **config: Any) -> dict[str, Any]:
    created: dict[str, Any] = await ok(
        await c.call("POST", APPS, json=machine_body(region, **config))
    )
    await ok(await c.call("GET", f"{APPS}/{created['id']}/wait", params={"state": "started"}))
    return created


async def test_suspend_start_signal_exec_ps_and_versions_through_the_broker(
    tmp_path: Path,
) -> None:
    async with cluster(tmp_path, SPECS) as c:
        m = await machine(c, restart={"policy": "no"})
        path = f"{APPS}/{m['id']}"
        body = await ok(await c.call("POST", path + "/suspend"))
        assert body["id"] == m["id"]
        await ok(await c.call("GET", path + "/wait", params={"state": "suspended"}))
        assert (await ok(await c.call("GET", path)))["state"] == "suspended"
        listed = await ok(await c.call("GET", APPS, params={"state": "suspended"}))
        assert [x["id"] for x in listed] == [m["id"]]
        # a suspended machine runs nothing new: exec is refused until a start resumes it
        resp = await c.call("POST", path + "/exec", json={"command": ["true"]})
        assert (await err(resp, 409))["code"] == "invalid_state"
        await ok(await c.call("POST", path + "/start"))
        await ok(await c.call("GET", path + "/wait", params={"state": "started"}))

        out = await ok(
            await c.call(
                "POST", path + "/exec", json={"command": ["sh", "-c", "echo $SOUK_APP_NAME"]}
            )
        )
        assert out == {"stdout": "demo\n", "stderr": "", "exit_code": 0}
        resp = await c.call("POST", path + "/exec", json={"command": ["sleep", "5"], "timeout": 1})
        assert (await err(resp, 408))["code"] == "timeout"
        await err(await c.call("POST", path + "/exec", json={"cmd": ""}), 400)

        procs = await ok(await c.call("GET", path + "/ps"))
        assert [p["command"] for p in procs] == ["sleep 60"]
        await err(await c.call("GET", path + "/ps", params={"order": "sideways"}), 400)

        assert await ok(await c.call("POST", path + "/signal", json={"signal": "SIGTERM"})) == {
            "ok": True
        }
        stopped = {"state": "stopped", "timeout": "10"}
        await ok(await c.call("GET", path + "/wait", params=stopped))  # sleep died of it
        await err(await c.call("POST", path + "/signal", json={"signal": "SIGTERM"}), 409)
        await err(await c.call("POST", path + "/signal", json={"signal": "SIGWHAT"}), 400)

        update = machine_body(env={"V": "2"}, restart={"policy": "no"})
        updated = await ok(await c.call("POST", path, json=update))
        versions = await ok(await c.call("GET", path + "/versions"))
        assert [v["version"] for v in versions] == [updated["instance_id"], m["instance_id"]]
        assert versions[0]["user_config"]["env"] == {"V": "2"}

        # another app's token reaches none of it; a read-only one reads but does not act
        for verb, route, payload in (
            ("POST", "/suspend", None),
            ("POST", "/exec", {"command": ["true"]}),
            ("GET", "/ps", None),
            ("GET", "/versions", None),
        ):
            resp = await c.call(verb, path + route, token=c.tokens["other"], json=payload)
            await err(resp, 403)
        read = c.tokens["demo-read"]
        await ok(await c.call("GET", path + "/versions", token=read))
        await err(await c.call("POST", path + "/suspend", token=read), 403)
        await err(await c.call("POST", f"{APPS}/nosuchmachine/suspend"), 404)


async def test_regions_and_placements_quote_without_reserving(tmp_path: Path) -> None:
    async with cluster(tmp_path, SPECS) as c:
        regions = await ok(await c.call("GET", "/v1/platform/regions"))
        caps = {r["code"]: r["capacity"] for r in regions["regions"]}
        assert caps == {"mad": 4, "ams": 4}  # 1-cpu 256 MB guests: cpus run out first
        q = {"cpus": "2", "memory_mb": "512"}
        regions = await ok(await c.call("GET", "/v1/platform/regions", params=q))
        assert {r["code"]: r["capacity"] for r in regions["regions"]} == {"mad": 2, "ams": 2}
        sized = await ok(
            await c.call("GET", "/v1/platform/regions", params={"size": "shared-cpu-2x"})
        )
        assert {r["code"]: r["capacity"] for r in sized["regions"]} == {"mad": 2, "ams": 2}
        await err(await c.call("GET", "/v1/platform/regions", params={"size": "huge"}), 400)
        await err(await c.call("GET", "/v1/platform/regions", params={"gpus": "1"}), 400)

        guest = {"cpus": 1, "memory_mb": 256}
        body = {"org_slug": "personal", "compute": guest, "count": 6, "region": "ams,mad"}
        quoted = await ok(await c.call("POST", "/v1/platform/placements", json=body))
        assert quoted == {"regions": [{"region": "ams", "count": 4}, {"region": "mad", "count": 2}]}
        every = {"org_slug": "personal", "compute": guest}
        quoted = await ok(await c.call("POST", "/v1/platform/placements", json=every))
        assert quoted["regions"] == [{"region": "ams", "count": 4}, {"region": "mad", "count": 4}]
        # nothing was reserved by the quotes: the workers' counters are untouched
        assert all(e.capacity().reserved.cpus == 0 for e in c.engines.values())
        # a create takes room, and the next quote sees it
        await machine(c, "mad")
        await c.fleet.refresh()  # type: ignore[attr-defined]  # the picture, polled here
        regions = await ok(await c.call("GET", "/v1/platform/regions"))
        assert {r["code"]: r["capacity"] for r in regions["regions"]}["mad"] == 3

        for bad in (
            {"compute": guest},
            {**every, "region": "iad"},
            {**every, "volume_name": "data"},
            {**every, "weights": {"region": 1000}},
            {**every, "count": -1},
        ):
            body = await err(await c.call("POST", "/v1/platform/placements", json=bad), 400)
        assert (
            "mad"
            in (
                await err(
                    await c.call(
                        "POST", "/v1/platform/placements", json={**every, "region": "iad"}
                    ),
                    400,
                )
            )["error"]
        )


async def test_an_organisations_machines_page_by_page(tmp_path: Path) -> None:
    async with cluster(tmp_path, SIM) as c:
        await ok(await c.call("POST", "/v1/apps", json={"name": "other"}), 201)
        await ok(
            await c.call("POST", "/v1/apps", json={"name": "elsewhere", "org_slug": "acme"}), 201
        )
        ids = {(await machine(c, "ams"))["id"] for _ in range(3)}
        other = await ok(await c.call("POST", "/v1/apps/other/machines", json=machine_body("ams")))
        await ok(await c.call("POST", "/v1/apps/elsewhere/machines", json=machine_body("mad")))
        await c.fleet.refresh()  # type: ignore[attr-defined]
        seen: list[dict[str, Any]] = []
        params: dict[str, str] = {"limit": "2"}
        while True:
            page = await ok(await c.call("GET", "/v1/orgs/personal/machines", params=params))
            seen += page["machines"]
            if "next_cursor" not in page:
                break
            assert page["last_machine_id"] == page["machines"][-1]["id"]
            params = {"limit": "2", "cursor": page["next_cursor"]}
        assert {m["id"] for m in seen} == ids | {other["id"]}  # not acme's
        assert {m["app_name"] for m in seen} == {"demo", "other"}
        assert all(m["state"] == "started" and m["region"] == "ams" for m in seen)
        # an app's token sees its own app's machines only; an operator's sees them all
        mine = await ok(await c.call("GET", "/v1/orgs/personal/machines", token=c.tokens["demo"]))
        assert {m["id"] for m in mine["machines"]} == ids
        fleet = await ok(await c.call("GET", "/v1/orgs/acme/machines", token=c.tokens["operator"]))
        assert [m["app_name"] for m in fleet["machines"]] == ["elsewhere"]
        await err(await c.call("GET", "/v1/orgs/personal/machines", params={"cursor": "!"}), 400)
        await err(await c.call("GET", "/v1/orgs/personal/machines", params={"state": "x"}), 400)


async def test_current_token_in_flys_shape_and_deploy_tokens(tmp_path: Path) -> None:
    async with cluster(tmp_path, SIM) as c:
        await ok(await c.call("POST", "/v1/apps", json={"name": "other"}), 201)
        current = await ok(await c.call("GET", "/v1/tokens/current", token=c.tokens["demo"]))
        (fly,) = current["tokens"]
        assert fly == {"token_id": current["id"], "apps": ["demo"], "org_slug": "personal"}
        admin = await ok(await c.call("GET", "/v1/tokens/current"))
        assert admin["tokens"] == [{"token_id": admin["id"]}]  # every app: none listed

        made = await ok(await c.call("POST", "/v1/apps/demo/deploy_token", json={"expiry": "720h"}))
        token = made["token"]
        info = await ok(await c.call("GET", "/v1/tokens/current", token=token))
        assert info["apps"] == ["demo"] and info["expires"] is not None
        await ok(await c.call("POST", APPS, token=token, json=machine_body()))
        await err(await c.call("GET", "/v1/apps/other/machines", token=token), 403)
        # it can do no more than the token it came from
        read = c.tokens["demo-read"]
        await err(await c.call("POST", "/v1/apps/demo/deploy_token", token=read, json={}), 403)
        await err(await c.call("POST", "/v1/apps/nope/deploy_token", json={}), 404)
        await err(await c.call("POST", "/v1/apps/demo/deploy_token", json={"expiry": "soon"}), 400)
