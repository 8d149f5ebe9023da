"""`souk dev --secure`'s dashboard in Debian's chromium: its public listeners show ECDSA
certificates, which browsers take (the cluster's Ed25519 ones end the handshake in Chromium),
so the operator's /ui opens over HTTPS and lists the fleet."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from souk.dev import dashboard_url, dev_cluster
from tests.broker.ui.test_dashboard_browser import (
    ARGS,
    CHROMIUM,
    DESKTOP,
    WAIT_MS,
    WORKERS,
    sync_api,
)

pytestmark = pytest.mark.integration


def open_dashboard(link: str, profile: Path) -> set[str | None]:
    """The workers the dashboard lists, once logged in through `link` over HTTPS (the page's
    certificate is issued by the dev CA, which this fresh profile does not trust: the check
    of its chain is waived, not the handshake)."""
    assert CHROMIUM is not None
    with sync_api.sync_playwright() as pw:
        browser = pw.chromium.launch_persistent_context(
            str(profile),
            executable_path=CHROMIUM,
            args=ARGS,
            headless=True,
            viewport=DESKTOP,
            ignore_https_errors=True,
        )
        try:
            page = browser.new_page()
            page.set_default_timeout(WAIT_MS)
            page.goto(link)
            page.wait_for_selector("#live.on")
            return {
                a.get_attribute("data-worker") for a in page.query_selector_all("article.worker")
            }
        finally:
            browser.close()


async def test_the_secure_dashboard_opens_in_chromium(tmp_path: Path) -> None:
    async with dev_cluster(tmp_path / "dev", port=0, proxy_port=0, driver="sim", secure=True) as d:
        assert d.api.startswith("https://")
        shown = await asyncio.to_thread(open_dashboard, dashboard_url(d), tmp_path / "profile")
    assert shown == WORKERS
