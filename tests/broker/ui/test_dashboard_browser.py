"""The dashboard in a real browser: Debian's chromium, headless, driven by Playwright for
Python, against `souk dev` (six workers in three regions) run as a user runs it.

It logs in with the link `souk dev` prints, then checks what an operator relies on: every
worker listed, a machine created through the API showing up without a reload, a cordon shown,
and a machine's placement explained with its candidates. Screenshots at desktop and phone
sizes are taken every run; with SOUK_SCREENSHOTS=1 they are also written to docs/images/,
where the docs show them.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest

from tests.support.dev import Dev, souk_dev

if TYPE_CHECKING:
    from playwright.sync_api import Page

CHROMIUM = shutil.which("chromium")
pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(
        CHROMIUM is None, reason="Debian's chromium is not installed (scripts/setup.sh does it)"
    ),
]
sync_api = pytest.importorskip(
    "playwright.sync_api", reason="playwright is not installed (the dev extra has it)"
)

# Quiet and self-contained: no GPU, no network of its own, nothing fetched in the background.
ARGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
DESKTOP = {"width": 1280, "height": 860}
PHONE = {"width": 390, "height": 844}
WAIT_MS = 15_000  # for a change to reach the page; a bound on a stuck test, not a measurement
WORKERS = {f"{region}{n}" for region in ("mad", "ams", "sin") for n in (1, 2)}
IMAGES = Path(__file__).resolve().parents[3] / "docs" / "images"


@pytest.fixture(scope="module")
def dev(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Dev, Path]]:
    data = tmp_path_factory.mktemp("souk-dev")
    with souk_dev(data) as cluster:
        yield cluster, data


def dashboard_link(data: Path) -> str:
    """The login link from what `souk dev` printed."""
    printed = (data / "dev.log").read_text()
    found = re.search(r"dashboard: (\S+/ui/login#token=\S+)", printed)
    assert found, f"souk dev printed no dashboard link:\n{printed}"
    return found.group(1)


def shoot(page: Page, name: str, out: Path) -> None:
    path = out / name
    page.screenshot(path=str(path), full_page=True)
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    if os.environ.get("SOUK_SCREENSHOTS") == "1":
        IMAGES.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, IMAGES / name)


def create(cluster: Dev, region: str, cpus: int) -> dict[str, Any]:
    config = {"init": {"exec": ["sleep", "300"]}, "guest": {"cpus": cpus, "memory_mb": 512}}
    made: dict[str, Any] = cluster.call(
        "POST", "/v1/apps/demo/machines", {"region": region, "config": config}
    )
    return made


def test_the_dashboard_follows_the_fleet_live(dev: tuple[Dev, Path], tmp_path: Path) -> None:
    cluster, data = dev
    assert CHROMIUM is not None
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(tmp_path / "profile"),  # a fresh profile: no cookie from an earlier run
            executable_path=CHROMIUM,
            args=ARGS,
            headless=True,
            viewport=DESKTOP,
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(WAIT_MS)
            # Not logged in: the fleet page sends the browser to the login form.
            page.goto(cluster.url + "/ui")
            assert page.url.startswith(cluster.url + "/ui/login")
            # The link souk dev prints logs in (its token never reaches the server's URL).
            page.goto(dashboard_link(data))
            page.wait_for_url(cluster.url + "/ui")
            page.wait_for_selector("#live.on")  # the change stream is open
            shown = {
                a.get_attribute("data-worker") for a in page.query_selector_all("article.worker")
            }
            assert shown == WORKERS
            assert page.locator("section.region").count() == 3
            # A mark on the page that a reload would wipe.
            page.evaluate("window.soukMark = 'still here'")

            # A machine created through the API appears without a reload.
            cluster.call("POST", "/v1/apps", {"name": "demo"})
            made = create(cluster, "mad", 2)
            row = page.wait_for_selector(
                f'#worker-{made["worker"]} li[data-machine="{made["id"]}"]'
            )
            assert row is not None and "demo" in row.inner_text()
            bar = page.locator(f"#worker-{made['worker']} .bar").first.inner_text()
            assert "2/4" in bar  # its CPUs are reserved on the worker's bar

            # A cordoned worker is shown cordoned, live as well.
            cluster.call("POST", "/v1/workers/ams1/cordon")
            page.wait_for_selector("#worker-ams1.cordoned .badge.cordoned")
            assert page.evaluate("window.soukMark") == "still here"

            # Placed past the cordon: its placement names both of the region's workers.
            placed = create(cluster, "ams", 3)
            assert placed["worker"] == "ams2"
            full = create(cluster, "sin", 4)
            page.wait_for_selector(f'li[data-machine="{full["id"]}"]')
            page.wait_for_selector(f'li[data-machine="{placed["id"]}"]')
            shoot(page, "dashboard-fleet.png", tmp_path)

            # The phone-sized window: one column of workers, nothing wider than the screen.
            page.set_viewport_size(PHONE)
            width = page.evaluate("document.documentElement.scrollWidth")
            assert width <= PHONE["width"]
            shoot(page, "dashboard-phone.png", tmp_path)
            page.set_viewport_size(DESKTOP)

            # The machine's page explains its placement: the candidates and their outcomes.
            page.click(f'li[data-machine="{placed["id"]}"] a')
            page.wait_for_selector("table.placement")
            candidates = {
                r.get_attribute("data-candidate"): r.inner_text()
                for r in page.query_selector_all("table.placement tr[data-candidate]")
            }
            assert set(candidates) == {"ams1", "ams2"}
            assert "placed" in candidates["ams2"]
            assert "refused" in candidates["ams1"] and "cordoned" in candidates["ams1"]
            shoot(page, "dashboard-placement.png", tmp_path)

            # The app's page: its machines by region and state.
            page.click("h1 small a")
            page.wait_for_selector("table.grid")
            grid = page.locator("table.grid").inner_text()
            assert all(region in grid for region in ("mad", "ams", "sin"))
        finally:
            browser.close()
            cluster.call("POST", "/v1/workers/ams1/uncordon")
