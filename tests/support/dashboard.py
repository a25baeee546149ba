"""The dashboard's browser: Debian's Chromium driven by playwright (which never
downloads a browser here), a page that records every request and console error,
and optional screenshots (MARLAAS_DASHBOARD_SHOTS=DIR)."""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import pytest

from areal_marlaas.service.dashboard import ASSETS

CHROMIUM = os.environ.get("MARLAAS_CHROMIUM", "/usr/bin/chromium")
# Chromium as the machine's closed network needs it (no background fetches).
CHROMIUM_ARGS = [
    "--no-sandbox",
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
]
SHOTS = os.environ.get("MARLAAS_DASHBOARD_SHOTS")


@contextlib.contextmanager
def chromium():
    """A headless Chromium; skips (fails with MARLAAS_REQUIRE_BROWSER=1, as CI
    sets) when playwright, the browser or the built bundle is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        sync_playwright = None
    if (
        sync_playwright is None
        or not Path(CHROMIUM).exists()
        or not (ASSETS / "app.js").is_file()
    ):
        why = (
            f"the dashboard's browser tests need playwright, Chromium at {CHROMIUM} "
            "and the built bundle: `make setup`"
        )
        if os.environ.get("MARLAAS_REQUIRE_BROWSER") == "1":
            pytest.fail(why)
        pytest.skip(why)
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


class DashboardPage:
    """A fresh browser context on the dashboard at ``base`` (the service's
    origin), recording every request and every console error."""

    def __init__(self, browser, base: str):
        self.ctx = browser.new_context(viewport={"width": 1280, "height": 900})
        self.page = self.ctx.new_page()
        self.base = base
        self.requests: list = []
        self.errors: list[str] = []
        self.page.on("request", lambda r: self.requests.append(r))
        self.page.on(
            "console",
            lambda m: self.errors.append(m.text) if m.type == "error" else None,
        )
        self.page.on("pageerror", lambda e: self.errors.append(str(e)))

    def sign_in(self, key: str, route: str = "") -> None:
        self.page.goto(f"{self.base}/dashboard{route}")
        self.page.fill("#api-key", key)
        self.page.click("form.sign-in button")

    def shot(self, name: str) -> None:
        if SHOTS:
            Path(SHOTS).mkdir(parents=True, exist_ok=True)
            self.page.screenshot(path=str(Path(SHOTS) / f"{name}.png"), full_page=True)

    def close(self) -> None:
        self.ctx.close()
