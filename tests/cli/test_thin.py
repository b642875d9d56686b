"""The thin CLI: every command runs in a `corral` process that loads neither the engine's libraries
(SQLAlchemy, pydantic, FastAPI, uvicorn) nor asyncio, whatever it prints; PyYAML only where it reads a
task file (to find the local files it must send)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

HEAVY = ("sqlalchemy", "pydantic", "fastapi", "uvicorn", "starlette", "asyncio", "yaml", "kubernetes")



def run_and_list(packages: tuple[str, ...], *, top_level: bool = True) -> str:
    """The real CLI in a fresh interpreter, then which of `packages` it imported, on stderr: by top-level
    package, or (`top_level=False`) by full module name."""
    name = 'm.split(".")[0]' if top_level else "m"
    return f"""
import json, sys
from corral.cli.main import main
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
loaded = sorted({{{name} for m in sys.modules}} & set({packages!r}))
print("HEAVY=" + json.dumps(loaded), file=sys.stderr)
sys.exit(code if isinstance(code, int) else 1)
"""


RUN_AND_LIST = run_and_list(HEAVY)

COMMANDS = [
    ["check"], ["check", "--json", "alpine"], ["gpus"], ["gpus", "--json", "H100"], ["queue"], ["queue", "--json"],
    ["queue", "--all"], ["logs", "nope"], ["cancel", "nope"], ["jobs", "queue"], ["api", "info"], ["--help"],
    ["launch", "--dryrun", "--", "true"], ["launch", "-d", "--infra", "slurm/alpine/cpu", "--", "true"],
    ["launch", "--dryrun", "TASK"], ["jobs", "launch", "--infra", "slurm/alpine/cpu", "TASK"],
    ["logs", "--tail", "1"], ["jobs", "logs", "--tail", "1"], ["logs", "--status", "nope"],
    ["jobs", "logs", "--status", "nope"],
    ["jobs", "logs", "nope"], ["jobs", "events", "nope"], ["jobs", "why", "nope"], ["jobs", "cancel", "nope"],
    ["status"], ["down", "nope"], ["exec", "nope", "--", "true"], ["ssh", "nope"], ["users", "list"],
    ["users", "remove", "nope"], ["users", "set", "nope", "--unix-user", "alpine=nope"], ["dashboard", "--print-url"],
    ["sbatch", "--dryrun", "-p", "cpu", "SCRIPT"], ["sbatch", "SCRIPT", "arg"], ["launch", "--dryrun", "SCRIPT"],
]
REFUSED = {"logs": "no job 'nope'", "logs --tail": "no jobs yet", "jobs logs --tail": "no managed jobs yet", "cancel": "no job 'nope'", "jobs logs": "no managed job 'nope'",
           "jobs events": "no managed job 'nope'", "jobs why": "no managed job 'nope'",
           "jobs cancel": "no managed job 'nope'", "exec": "no dev allocation 'nope'", "ssh": "no dev allocation 'nope'",
           "users set": "no user 'nope'"}


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a))
def test_no_command_loads_an_engine_library(corral_env, clean_queues, tmp_path, argv):
    task = tmp_path / "task.yaml"
    task.write_text("resources:\n  cpus: 1\nrun: 'true'\n")
    script = tmp_path / "job.sh"
    script.write_text("#!/bin/bash\n#SBATCH --time=1 -c 1\ntrue\n")
    argv = [str(task) if a == "TASK" else str(script) if a == "SCRIPT" else a for a in argv]
    proc = subprocess.run([sys.executable, "-c", RUN_AND_LIST, *argv], env=corral_env, capture_output=True,
                          text=True, timeout=60)
    heavy = json.loads(proc.stderr.rsplit("HEAVY=", 1)[1])
    allowed = {"yaml"} if str(task) in argv else set()
    assert set(heavy) <= allowed, f"`corral {' '.join(argv)}` imported {heavy}"
    refused = REFUSED.get(" ".join(argv[:3])) or REFUSED.get(" ".join(argv[:2])) or REFUSED.get(argv[0])
    if refused:  # answered by the server: a clear refusal, not a crash
        assert proc.returncode == 66 and f"corral: error: {refused}" in proc.stderr, proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr


@pytest.mark.parametrize("argv", [["check", "--json", "alpine"], ["gpus", "--json", "H100"], ["queue", "--json"],
                                  ["queue", "--all", "--json"], ["jobs", "queue", "--json"],
                                  ["status", "--json"]], ids=lambda a: " ".join(a))
def test_json_output_loads_no_table_library(corral_env, argv):
    """Scripts that read --json do not pay for rich (~20 ms of a 0.1 s command)."""
    proc = subprocess.run([sys.executable, "-c", run_and_list(("rich",)), *argv], env=corral_env, capture_output=True,
                          text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr.rsplit("HEAVY=", 1)[1]) == [], f"`corral {' '.join(argv)}` imported rich"


@pytest.mark.parametrize("argv", [["--help"], ["jobs", "--help"], ["launch", "--help"]], ids=lambda a: " ".join(a))
def test_help_loads_no_client(tmp_path, argv):
    """Help talks to no server, so it loads neither the SDK nor `http` (~40 ms of a 0.1 s goal)."""
    proc = subprocess.run([sys.executable, "-c", run_and_list(("corral.sdk", "http.client"), top_level=False), *argv],
                          env={**os.environ, "CORRAL_HOME": str(tmp_path)}, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stderr.rsplit("HEAVY=", 1)[1]) == [], f"`corral {' '.join(argv)}` loaded the client"


def test_a_command_that_finds_its_server_running_does_not_load_the_servers_module(corral_env):
    """Only starting or restarting the server needs controller/server.py (~3 ms of imports on every call)."""
    listed = run_and_list(("corral.controller.server", "subprocess"), top_level=False)
    first = subprocess.run([sys.executable, "-c", listed, "queue"], env=corral_env, capture_output=True, text=True,
                           timeout=60)
    assert first.returncode == 0, first.stderr
    assert "corral.controller.server" in first.stderr.rsplit("HEAVY=", 1)[1]  # it started the server
    again = subprocess.run([sys.executable, "-c", listed, "queue"], env=corral_env, capture_output=True, text=True,
                           timeout=60)
    assert again.returncode == 0, again.stderr
    assert json.loads(again.stderr.rsplit("HEAVY=", 1)[1]) == [], "`corral queue` loaded the server's module"
