"""Shared fixtures. Integration tests use the real local testbed (root only), reached over real SSH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(autouse=True)
def fresh_status_lines() -> Iterator[None]:
    """What a process learns of each cluster's status queries (infra/slurm/jobs.status_lines_for: the
    site's squeue options, a failed last query) and of its probes (client._FAILING_SLOWLY) starts
    afresh in each test, as in a new server."""
    yield
    from corral import client
    from corral.infra.slurm import jobs

    jobs._STATUS_LINES.clear()
    client._FAILING_SLOWLY.clear()


@dataclass
class CliResult:
    exit_code: int
    stdout: str
    stderr: str
    seconds: float

    def json(self) -> object:
        return json.loads(self.stdout)


@pytest.fixture(scope="session")
def testbed() -> Iterator[object]:
    """The real multi-cluster testbed, brought up once per session (and down again if we started it)."""
    if os.geteuid() != 0:
        pytest.skip("the Slurm testbed needs root")
    from testbed import Testbed

    bed = Testbed()
    was_up = all(all(v.values()) for v in bed.status().values())
    bed.up(install_user_config=False)
    yield bed
    if not was_up:
        bed.down()


@pytest.fixture(scope="session")
def machines(testbed) -> Iterator[object]:
    """The testbed's plain SSH machines (an ssh/<pool>'s), brought up once (and down if we started them)."""
    machines = testbed.machines
    was_up = machines.root.exists() and all(machines.status().values())
    machines.up()
    yield machines
    if not was_up:
        machines.down()


@pytest.fixture(scope="session")
def kube(testbed) -> Iterator[object]:
    """A FAKE Kubernetes API server (testbed/kubeapi.py: no real Kubernetes can be installed here), with
    nodes kn1-kn4 and a kubeconfig whose context is `kind-fake`; one for the session."""
    from testbed.kubeapi import FakeKubernetes

    fake = FakeKubernetes(testbed.paths.root / "kube")
    fake.up()
    yield fake
    fake.down()


# The testbed's SSH machines as one pool (`ssh/lab`), lab4 with an A10G of its own.
POOL = {"pools": {"lab": {"hosts": ["lab1", "lab2", "lab3", "lab4"], "gpus": {"lab4": "A10G:1"}}}}


@pytest.fixture
def pool_env(corral_env, testbed, machines, tmp_path):
    """The testbed's cluster file with the machines' Host entries added, and the pool in config.yaml."""
    config = tmp_path / "cluster-file"
    config.write_text(testbed.cluster_config.read_text() + "\n" + machines.ssh_config.read_text())
    home = tmp_path / "corral-home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(json.dumps(POOL))
    env = {**corral_env, "CORRAL_SLURM_CONFIG": str(config)}
    yield env
    subprocess.run(["corral", "cancel", "--all"], env=env, capture_output=True)
    for machine in machines.machines:
        subprocess.run(["ssh", "-F", str(machines.ssh_config), machine.name, "pkill -u corral-test -f corral/runs/"],
                       capture_output=True)


@pytest.fixture
def controller_stopped(testbed) -> Iterator[str]:
    """cirrus' slurmctld stopped for the test (its login node still answers)."""
    testbed.stop_controller("cirrus")
    yield "cirrus"
    testbed.start_controller("cirrus")


@pytest.fixture
def corral_env(testbed, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """Environment pointing Corral at the testbed, with its own state dir (fresh ControlMasters)."""
    home = tmp_path / "corral-home"
    env = {**os.environ, "CORRAL_SLURM_CONFIG": str(testbed.cluster_config), "CORRAL_HOME": str(home)}
    monkeypatch.setenv("CORRAL_SLURM_CONFIG", str(testbed.cluster_config))
    monkeypatch.setenv("CORRAL_HOME", str(home))
    yield env
    from corral.controller import server
    from corral.ssh import control_dir, stop_masters

    server.stop()  # the server the test's commands started, if any
    sockets = control_dir()
    stop_masters(sockets, "exit")  # and the ControlMasters the test itself opened
    shutil.rmtree(sockets, ignore_errors=True)


@pytest.fixture
def corral(corral_env) -> Callable[..., CliResult]:
    """Run the real `corral` CLI in a subprocess."""

    def run(*args: str, env: dict[str, str] | None = None, timeout: float = 60, cwd: Path | None = None) -> CliResult:
        started = time.monotonic()
        proc = subprocess.run([sys.executable, "-m", "corral", *args], capture_output=True, text=True,
                              env=env or corral_env, timeout=timeout, cwd=cwd)
        return CliResult(proc.returncode, proc.stdout, proc.stderr, time.monotonic() - started)

    return run


def wait_for(what: str, predicate: Callable[[], object], timeout: float = 30, interval: float = 0.2) -> object:
    """Poll until predicate() is truthy; fail the test with `what` after `timeout` seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout}s waiting for {what}")
        time.sleep(interval)


@pytest.fixture(scope="session")
def postgres_url() -> Iterator[str]:
    """A private, real PostgreSQL server on a unix socket, for the team-mode state store."""
    from testbed import postgres

    if not postgres.available():
        pytest.skip("needs root and Debian's postgresql package")
    with postgres.postgres_server() as url:
        yield url


@pytest.fixture
def fresh_postgres(postgres_url: str) -> Iterator[str]:
    """The session's PostgreSQL database, emptied: a store made on it starts from nothing."""
    from testbed import postgres

    postgres.empty(postgres_url)
    yield postgres_url


@pytest.fixture
def clean_queues(testbed):
    """Cancel every job of the test user on every cluster after the test."""
    yield
    for spec in testbed.clusters:
        subprocess.run(["ssh", "-F", str(testbed.cluster_config), spec.name, "scancel -u corral-test"],
                       capture_output=True)


@pytest.fixture
def corral_home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A private CORRAL_HOME for tests that need no cluster."""
    home = tmp_path / "corral-home"
    monkeypatch.setenv("CORRAL_HOME", str(home))
    return home


def refusing_cluster_file(work: Path) -> Path:
    """A cluster file of two clusters whose login nodes refuse connections at once (port 1)."""
    config = work / "slurm-config"
    config.write_text("Host alpine\n    HostName 127.0.0.1\n    Port 1\nHost borealis\n    HostName 127.0.0.1\n"
                      "    Port 1\n")
    return config


@pytest.fixture
def refusing_clusters(tmp_path_factory, monkeypatch) -> Iterator[Path]:
    work = tmp_path_factory.mktemp("fuzz")
    config = refusing_cluster_file(work)
    (work / "task.yaml").write_text("resources:\n  accelerators: H100:1\nrun: echo hi\n")
    (work / "bad.yaml").write_text("resources:\n  acelerators: H100\n")
    (work / "latin1.yaml").write_bytes(b"run: caf\xe9\n")
    (work / "secret.yaml").write_text("secrets:\n  HF_TOKEN: null\nrun: echo hi\n")
    (work / "job.sh").write_text("#!/bin/bash\n#SBATCH --gres=gpu:h100:1 -t 5 --array=0-3\necho hi\n")
    (work / "badjob.sh").write_text("#!/bin/bash\n#SBATCH --gress=gpu:1\n#SBATCH -J 'open\necho\n")
    monkeypatch.setenv("CORRAL_SLURM_CONFIG", str(config))
    monkeypatch.setenv("CORRAL_HOME", str(work / "home"))
    monkeypatch.chdir(work)
    yield work
    from corral.controller import server

    server.stop()  # started by the commands that go through it


class S3Server:
    """A local S3-compatible server (moto's, over real HTTP): what an S3 client sees of a store, reached
    through AWS_ENDPOINT_URL as MinIO or Ceph would be."""

    def __init__(self, url: str):
        self.url = url
        self.env = {"AWS_ENDPOINT_URL": url, "AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing",
                    "AWS_DEFAULT_REGION": "us-east-1"}

    def client(self):
        import boto3

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def bucket_with_data(self, name: str) -> str:
        """A new bucket holding imagenet/train/{a.txt, sub/b.txt} and model.bin (1000 bytes)."""
        import re

        bucket = "data-" + re.sub(r"[^a-z0-9-]", "-", name.lower())[-40:].strip("-")
        client = self.client()
        client.create_bucket(Bucket=bucket)
        client.put_object(Bucket=bucket, Key="imagenet/train/a.txt", Body=b"alpha\n")
        client.put_object(Bucket=bucket, Key="imagenet/train/sub/b.txt", Body=b"beta beta\n")
        client.put_object(Bucket=bucket, Key="model.bin", Body=b"\x00" * 1000)
        return bucket


@pytest.fixture(scope="session")
def s3_server():
    import socket

    from moto.server import ThreadedMotoServer

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    yield S3Server(f"http://127.0.0.1:{port}")
    server.stop()
