"""Fixtures shared by the CLI's integration tests."""

from __future__ import annotations

import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest


@pytest.fixture
def clean_queues(testbed):
    """Cancel every job of the test user on every cluster after the test."""
    yield
    for spec in testbed.clusters:
        subprocess.run(["ssh", "-F", str(testbed.cluster_config), spec.name, "scancel -u corral-test"],
                       capture_output=True)


@pytest.fixture
def refusing_clusters(tmp_path_factory, monkeypatch) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("fuzz")
    config = work / "slurm-config"
    config.write_text("Host alpine\n    HostName 127.0.0.1\n    Port 1\nHost borealis\n    HostName 127.0.0.1\n"
                      "    Port 1\n")
    (work / "task.yaml").write_text("resources:\n  accelerators: H100:1\nrun: echo hi\n")
    (work / "bad.yaml").write_text("resources:\n  acelerators: H100\n")
    (work / "latin1.yaml").write_bytes(b"run: caf\xe9\n")
    monkeypatch.setenv("CORRAL_SLURM_CONFIG", str(config))
    monkeypatch.setenv("CORRAL_HOME", str(work / "home"))
    monkeypatch.chdir(work)
    yield work
    from corral.controller import server

    server.stop()  # started by the commands that go through it
