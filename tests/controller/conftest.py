"""Fixtures of the server's tests: a real headless Chromium for the dashboard's pages."""

from __future__ import annotations

import shutil

import pytest

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright, one per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # As root (CI, the testbed), Chromium's own sandbox cannot start; the pages are our own.
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()
