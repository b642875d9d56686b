"""Fixtures of the server's tests: a real local server whose clusters refuse connections, and a real
headless Chromium for the dashboard's pages."""

from __future__ import annotations

import shutil

import pytest

from tests.conftest import refusing_cluster_file

CHROMIUM = shutil.which("chromium") or "/usr/bin/chromium"


@pytest.fixture(scope="module")
def refusing_server(tmp_path_factory):
    """The endpoint (url, token) of a local server, one per test module, whose clusters refuse
    connections at once: for what the API answers before it asks any cluster."""
    work = tmp_path_factory.mktemp("server")
    with pytest.MonkeyPatch.context() as patch:  # refusing_clusters' setting, for the whole module
        patch.setenv("CORRAL_SLURM_CONFIG", str(refusing_cluster_file(work)))
        patch.setenv("CORRAL_HOME", str(work / "home"))
        patch.chdir(work)
        from corral.controller import server as local_server
        from corral.sdk import Client

        try:
            yield Client().endpoint
        finally:
            local_server.stop()


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium driven by Playwright, one per test module."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        # As root (CI, the testbed), Chromium's own sandbox cannot start; the pages are our own.
        chromium = playwright.chromium.launch(executable_path=CHROMIUM, args=["--no-sandbox"])
        yield chromium
        chromium.close()
