"""The dashboard's pages in process: who gets in (bearer token or login cookie, operators only),
what a browser is sent when refused, escaping, fragments, and the live stream of changes."""

from __future__ import annotations

import json
from typing import Any

from souk.catalog.bus import InProcessBus
from tests.broker.test_api import err, ok
from tests.support.broker_cluster import Cluster, ClusterFactory, WorkerSpec, machine_body

HTML = {"Accept": "text/html,application/xhtml+xml"}  # as a browser navigating asks


def cookie(token: str) -> dict[str, str]:
    return {"Cookie": f"souk_ui={token}"}


async def get(c: Cluster, path: str, headers: dict[str, str] | None = None) -> Any:
    return await c.broker.get(path, headers=headers or {}, allow_redirects=False)


async def test_the_login_keeps_an_operator_token_in_a_cookie_for_the_dashboard_only(
    small: Cluster,
) -> None:
    c, op = small, small.tokens["operator"]
    resp = await c.broker.post("/ui/login", data={"token": op}, allow_redirects=False)
    assert resp.status == 303 and resp.headers["Location"] == "/ui"
    set_cookie = resp.headers["Set-Cookie"]
    assert set_cookie.startswith(f"souk_ui={op};")
    for attribute in ("HttpOnly", "Path=/ui", "SameSite=Strict"):
        assert attribute in set_cookie
    page = await get(c, "/ui", cookie(op))
    assert page.status == 200 and page.content_type == "text/html"
    assert "script-src 'self'" in page.headers["Content-Security-Policy"]
    text = await page.text()
    for worker in ("m1", "m2", "a1"):
        assert f'data-worker="{worker}"' in text
    # a cordoned worker and one the broker cannot reach are marked so
    await ok(await c.call("POST", "/v1/workers/m1/cordon", token=op))
    await c.fleet.refresh()  # type: ignore[attr-defined]  # the static fleet's picture
    c.fleet._reachable.discard("a1")  # type: ignore[attr-defined]  # as a failed refresh does
    text = await (await get(c, "/ui", cookie(op))).text()
    assert 'class="worker cordoned" data-worker="m1"' in text
    assert 'class="worker unreachable" data-worker="a1"' in text
    assert 'class="worker " data-worker="m2"' in text
    assert '<span class="badge unreachable">unreachable</span>' in text
    # the cookie is the dashboard's: the API takes bearer tokens only
    await err(await get(c, "/v1/workers", cookie(op)), 401)
    # a fragment is the page's main part alone, for live updates
    fragment = await (await get(c, "/ui?fragment=1", cookie(op))).text()
    assert "<html" not in fragment and 'data-worker="a1"' in fragment
    # logging out drops the cookie
    out = await c.broker.post("/ui/logout", allow_redirects=False)
    assert out.status == 303 and 'souk_ui=""' in out.headers["Set-Cookie"]
    await err(await c.broker.post("/ui/login", data={"token": ""}), 400)


async def test_a_browser_without_an_operator_token_is_sent_to_the_login_form(
    small: Cluster,
) -> None:
    c = small
    refused = await get(c, "/ui/apps", HTML)
    assert refused.status == 303
    assert refused.headers["Location"].startswith("/ui/login?why=log%20in")
    app_token = await get(c, "/ui", {**HTML, **cookie(c.tokens["demo"])})
    assert app_token.status == 303 and "operator" in app_token.headers["Location"]
    assert "souk_ui=" in app_token.headers["Set-Cookie"]  # the useless cookie is dropped
    bad = await get(c, "/ui", {**HTML, **cookie("souk1_bm90LWEtdG9rZW4.c2ln")})
    assert bad.status == 303 and "refused" in bad.headers["Location"]
    # a program (no text/html) gets the API's JSON errors; so does an app token's bearer
    await err(await get(c, "/ui"), 401)
    await err(await get(c, "/ui", c.auth(c.tokens["admin"])), 403)
    form = await get(c, "/ui/login?why=%3Cb%3Ebad%3C%2Fb%3E")
    text = await form.text()
    assert form.status == 200 and "&lt;b&gt;bad&lt;/b&gt;" in text and "<b>bad" not in text
    script = await get(c, "/ui/static/ui.js")
    assert script.status == 200 and script.content_type == "text/javascript"
    assert "EventSource" in await script.text()
    await err(await get(c, "/ui/static/nope.js"), 401)  # no probing paths without a token
    await err(await get(c, "/ui/static/nope.js", c.auth(c.tokens["operator"])), 404)


async def test_the_app_and_machine_pages_show_releases_events_and_placement_escaped(
    small: Cluster,
) -> None:
    c = small
    op = c.auth(c.tokens["operator"])
    release = {
        "version": 1,
        "status": "complete",
        "strategy": "rolling",
        "created_at": "2026-01-01T00:00:00Z",
        "description": "<script>alert(1)</script>",
    }
    patch = {"set": {"release.1": json.dumps(release)}}
    await ok(await c.call("PATCH", "/v1/apps/demo/metadata", json=patch))
    made = await ok(await c.call("POST", "/v1/apps/demo/machines", json=machine_body("mad")))
    await c.fleet.refresh()  # type: ignore[attr-defined]  # the static fleet's picture
    page = await (await get(c, "/ui/apps/demo", op)).text()
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in page and "<script>alert" not in page
    assert made["id"] in page and "v1" in page
    assert "<td>launch</td>" in page  # the machine's events (Fly's types), from its worker
    machine = await (await get(c, f"/ui/apps/demo/machines/{made['id']}", op)).text()
    assert 'class="placement"' in machine and f'data-candidate="{made["worker"]}"' in machine
    await err(await get(c, "/ui/apps/nope", op), 404)
    await err(await get(c, "/ui/apps/demo/machines/0123456789abcd", op), 404)


async def test_the_event_stream_tells_of_catalog_changes(make_cluster: ClusterFactory) -> None:
    bus = InProcessBus()
    try:
        async with make_cluster([WorkerSpec("m1", "mad")], bus=bus) as c:
            op = c.auth(c.tokens["operator"])
            stream = await c.broker.get("/ui/events", headers=op)
            assert stream.status == 200
            assert stream.headers["Content-Type"].startswith("text/event-stream")
            await ok(await c.call("POST", "/v1/apps/demo/machines", json=machine_body("mad")))
            tables: set[str] = set()
            while "machines" not in tables:
                line = (await stream.content.readline()).decode()
                assert line, "the stream ended"
                if line.startswith("data: "):
                    tables |= set(json.loads(line[len("data: ") :])["tables"])
            stream.close()
            await err(await c.broker.get("/ui/events", headers=c.auth()), 403)
    finally:
        await bus.close()
