"""The controller's loopback HTTP API: token, health and tick figures, wake-up, managed jobs."""

from __future__ import annotations

import json
import os
import stat
import subprocess
import sys
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.helpers import counting_ssh


@pytest.fixture
def slow_controller(corral_env):
    # A tick a minute: any tick within a test's wait comes from a wake-up.
    env = {**corral_env, "CORRAL_CONTROLLER_INTERVAL": "60"}
    yield env
    subprocess.run([sys.executable, "-m", "corral", "server", "stop"], env=env, capture_output=True)


# Runs the CLI in-process with sys.argv[1:], then says whether SQLAlchemy was imported.
LOADS_SQLALCHEMY = """
import sys
from corral.cli.main import cli
try:
    cli(sys.argv[1:], prog_name="corral")
except SystemExit as exc:
    code = exc.code
else:
    code = 0
print("sqlalchemy loaded:", "sqlalchemy" in sys.modules, file=sys.stderr)
sys.exit(code)
"""


def request(endpoint: dict, path: str, method: str = "GET", token: str | None = None) -> tuple[int, object]:
    headers = {"Authorization": f"Bearer {endpoint['token'] if token is None else token}"}
    req = urllib.request.Request(f"http://127.0.0.1:{endpoint['port']}{path}", method=method, headers=headers)
    try:
        with urllib.request.urlopen(req, timeout=5) as response:
            return response.status, json.loads(response.read())
    except urllib.error.HTTPError as exc:
        return exc.code, json.loads(exc.read())


def test_api_on_loopback_with_a_token(corral, slow_controller):
    env = slow_controller
    assert corral("server", "start", env=env).exit_code == 0
    path = Path(env["CORRAL_HOME"]) / "controller.json"
    assert stat.S_IMODE(path.stat().st_mode) == 0o600
    endpoint = json.loads(path.read_text())
    assert request(endpoint, "/health", token="wrong")[0] == 401
    assert request(endpoint, "/health", token="")[0] == 401
    code, health = request(endpoint, "/health")
    assert code == 200 and health["pid"] == endpoint["pid"]
    first = wait_for("the first tick", lambda: request(endpoint, "/health")[1]["ticks"] >= 1)
    assert first
    ticks = request(endpoint, "/health")[1]["ticks"]
    # `jobs launch` wakes it through the API: the job is submitted long before the 60 s interval.
    launched = corral("jobs", "launch", "--json", "--cpus", "1", "--infra", "slurm/alpine/cpu", "--", "true", env=env)
    assert launched.exit_code == 0, launched.stderr
    job_id = launched.json()["job_id"]
    wait_for("a tick caused by the wake-up", lambda: request(endpoint, "/health")[1]["ticks"] > ticks, timeout=10)
    code, jobs = request(endpoint, "/v1/managed?all=true")
    assert code == 200 and [j["job_id"] for j in jobs["jobs"]] == [job_id] and jobs["more"] == 0
    code, job = request(endpoint, f"/v1/managed/{job_id}")
    assert code == 200 and job["events"][0]["state"] == "PENDING"
    assert request(endpoint, "/v1/managed/nope")[0] == 404
    woken = request(endpoint, "/wake", "POST")
    assert woken[0] == 200 and woken[1]["woken"] is True
    status = corral("server", "status", "--json", env=env).json()
    assert status["running"] and status["ticks"] >= ticks + 1 and status["lease"]["holder"].endswith(
        f":{endpoint['pid']}")
    # While it runs, `jobs queue` and `server status` are answered by it: the CLI process loads
    # neither the engine nor the database, and prints what the store would give.
    light = subprocess.run([sys.executable, "-c", LOADS_SQLALCHEMY, "jobs", "queue", "--json", "--all"], env=env,
                           capture_output=True, text=True, timeout=30)
    assert light.returncode == 0, light.stderr
    assert light.stderr.strip() == "sqlalchemy loaded: False"
    via_api = json.loads(light.stdout)
    status_light = subprocess.run([sys.executable, "-c", LOADS_SQLALCHEMY, "server", "status"], env=env,
                                  capture_output=True, text=True, timeout=30)
    assert status_light.stderr.strip() == "sqlalchemy loaded: False" and "ticks" in status_light.stdout
    corral("jobs", "cancel", job_id, env=env)
    assert corral("server", "stop", env=env).exit_code == 0
    assert not path.exists()
    from_store = corral("jobs", "queue", "--json", "--all", env=env).json()  # a new server, the same store
    assert [(j["job_id"], j["name"], j["attempts"]) for j in via_api] == \
           [(j["job_id"], j["name"], j["attempts"]) for j in from_store]
    assert corral("server", "stop", env=env).exit_code == 0
    stopped = corral("server", "status", env=env)
    assert stopped.exit_code == 1 and stopped.stdout.strip() == "controller not running"
    assert os.path.exists(Path(env["CORRAL_HOME"]) / "controller.log")


def test_a_starting_server_opens_a_master_to_every_slurm_cluster_ahead(corral, slow_controller, tmp_path):
    """While its modules load, the server opens each cluster's ControlMaster (`ssh -N -f`, no remote
    command); the first probe then goes over it, and the only round trip per cluster is the probe's."""
    from corral.ssh import control_dir

    env, calls = counting_ssh(tmp_path, slow_controller)
    assert corral("server", "start", env=env).exit_code == 0
    sockets = control_dir()
    wait_for("a master per cluster", lambda: len([s for s in sockets.iterdir() if s.is_socket()]) == 3, timeout=20)
    log = (tmp_path / "ssh-calls").read_text().splitlines()
    opened = sorted(line.split(" -- ")[1] for line in log if " -N -f -- " in line)
    assert opened == ["alpine", "borealis", "cirrus"] and len(log) == 6  # and an `ssh -G` each
    gpus = corral("gpus", "--json", env=env)
    assert gpus.exit_code == 0, gpus.stderr
    assert sorted(calls()) == ["alpine", "borealis", "cirrus"]  # the probes: over the masters
    assert len([s for s in sockets.iterdir() if s.is_socket()]) == 3  # no second connection to any
