"""The thin CLI: every command the server answers runs in a `corral` process that loads neither the
engine's libraries (SQLAlchemy, pydantic, FastAPI, uvicorn) nor asyncio, whatever it prints."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("sqlalchemy", "pydantic", "fastapi", "uvicorn", "starlette", "asyncio", "yaml")

# The real CLI in a fresh interpreter, then the heavy top-level packages it imported, on stderr.
RUN_AND_LIST = f"""
import json, sys
from corral.cli.main import main
try:
    main()
except SystemExit as exc:
    code = exc.code
else:
    code = 0
loaded = sorted({{m.split(".")[0] for m in sys.modules}} & set({HEAVY!r}))
print("HEAVY=" + json.dumps(loaded), file=sys.stderr)
sys.exit(code if isinstance(code, int) else 1)
"""

COMMANDS = [
    ["check"], ["check", "--json", "alpine"], ["gpus"], ["gpus", "--json", "H100"], ["queue"], ["queue", "--json"],
    ["queue", "--all"], ["logs", "nope"], ["cancel", "nope"], ["jobs", "queue"], ["api", "info"], ["--help"],
]


@pytest.mark.parametrize("argv", COMMANDS, ids=lambda a: " ".join(a))
def test_commands_the_server_answers_load_no_engine_library(corral_env, argv):
    proc = subprocess.run([sys.executable, "-c", RUN_AND_LIST, *argv], env=corral_env, capture_output=True,
                          text=True, timeout=60)
    heavy = json.loads(proc.stderr.rsplit("HEAVY=", 1)[1])
    assert heavy == [], f"`corral {' '.join(argv)}` imported {heavy}"
    if argv[0] in ("logs", "cancel"):  # answered by the server: a clear refusal, not a crash
        assert proc.returncode == 1 and "corral: error: no job 'nope'" in proc.stderr
    else:
        assert proc.returncode == 0, proc.stderr
