"""Starting the server (controller/server.py): the command that starts it is told when the API answers
(not by polling), hears at once why it could not start, and is served before the server's first tick."""

from __future__ import annotations

import socket
import time
from pathlib import Path

import pytest

from corral.controller import server
from corral.errors import ConfigError
from corral.sdk import Client
from tests.conftest import wait_for


def test_the_command_that_starts_the_server_is_served_before_its_first_tick(corral_env):
    assert server.running_pid() is None
    first = Client().health()  # starts this home's server, then asks it
    answered = time.time()
    assert first["ticks"] == 0 and first["last_tick"] is None, first
    later = wait_for("the server's first tick", lambda: (h := Client().health())["ticks"] >= 1 and h, timeout=20)
    assert later["pid"] == first["pid"] and later["last_tick"]["at"] >= answered


def test_a_server_that_cannot_serve_says_why_at_once(corral, corral_env):
    home = Path(corral_env["CORRAL_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("submit_as: service\n")
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        # It opens the clusters' ControlMasters before it binds: they outlive it, and must not hold the
        # pipe it tells its starter on, or the command would wait out the start's 10 s and say only that.
        started = corral("server", "start", "--host", "127.0.0.1", "--port", str(port))
    assert started.exit_code == 78, started.stderr
    assert started.stderr.strip() == f"corral: error: cannot serve on 127.0.0.1:{port}: Address already in use"
    assert started.seconds < server.START_SECONDS  # not a speed figure: the deadline was not waited out
    assert server.running_pid() is None


@pytest.mark.parametrize("name, value", [
    ("CORRAL_REQUEST_HEAD_SECONDS", "abc"),  # read per connection: every request failed
    ("CORRAL_USAGE_SAMPLE_SECONDS", "0"),  # read after the start: the server died once it had started
    ("CORRAL_CONTROLLER_GRACE_SECONDS", "soon"),
])
def test_a_setting_that_is_not_a_number_stops_the_start_with_one_line(corral, corral_env, name, value):
    started = corral("server", "start", env={**corral_env, name: value})
    assert started.exit_code == 78, started.stderr
    assert started.stderr.startswith(f"corral: error: {name}={value!r} is not a number of seconds")
    assert len(started.stderr.strip().splitlines()) == 1 and server.running_pid() is None


def test_a_servers_options_are_those_its_starter_gives_it(monkeypatch):
    monkeypatch.setenv("CORRAL_SERVER_PORT", "abc")
    with pytest.raises(ConfigError, match=r"^CORRAL_SERVER_PORT='abc' is not a port \(0 to 65535\)$"):
        server.ServerOptions.from_env()
    # the background server's environment: what `start` was given, not what the shell had (it had
    # started a team server with a CORRAL_SERVER_TRUSTED_PROXIES it could not read, then died)
    inherited = {"CORRAL_SERVER_TRUSTED_PROXIES": "notacidr", "CORRAL_DB_URL": "sqlite:///x", "PATH": "/bin"}
    assert server._without_server_options(inherited) == {"CORRAL_DB_URL": "sqlite:///x", "PATH": "/bin"}
