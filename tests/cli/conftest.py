"""Fixtures shared by the CLI's integration tests."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest


@pytest.fixture
def clean_queues(testbed):
    """Cancel every job of the test user on every cluster after the test."""
    yield
    for spec in testbed.clusters:
        subprocess.run(["ssh", "-F", str(testbed.cluster_config), spec.name, "scancel -u corral-test"],
                       capture_output=True)
