"""The broker's `images/pin` (souk extension): asked of a worker of the region, and why no
worker could answer, said plainly. Against a real registry: test_deploy_pinned.py in
tests/worker/oci/machines."""

from __future__ import annotations

from tests.support.broker_cluster import ClusterFactory, WorkerSpec

PIN = "/v1/apps/demo/images/pin"
IMAGE = "registry.example/web:1"


async def test_a_pin_asks_the_regions_workers_and_says_why_none_could(
    make_cluster: ClusterFactory,
) -> None:
    specs = [WorkerSpec("m1", "mad"), WorkerSpec("m2", "mad"), WorkerSpec("a1", "ams")]
    async with make_cluster(specs) as c:  # sim workers: they run no images

        async def pin(body: dict[str, str], path: str = PIN) -> tuple[int, str]:
            resp = await c.call("POST", path, json=body)
            return resp.status, (await resp.json())["code"]

        assert await pin({"image": IMAGE, "region": "mad"}) == (409, "images_unsupported")
        assert await pin({"image": IMAGE}) == (409, "images_unsupported")  # any region's
        assert await pin({"image": IMAGE, "region": "lhr"}) == (503, "no_workers")
        assert (await pin({"image": ""}))[0] == 400
        assert await pin({"image": IMAGE}, "/v1/apps/nope/images/pin") == (404, "not_found")
