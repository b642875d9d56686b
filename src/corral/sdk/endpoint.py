"""Which Corral server to talk to, and with which token. Standard library only.

In order: the arguments given to `Client`; `CORRAL_API_URL` (with `CORRAL_API_TOKEN`); the server saved
by `corral api login` (`api.json` in CORRAL_HOME, mode 600); otherwise this user's local server, started
on demand on loopback (its port and token are in `controller.json`, mode 600).

A local server runs with the settings of the command that started it. When a later command names another
cluster file, `ssh`, CORRAL_TIMEOUT or store (CORRAL_DB_URL), the local server is restarted with them (jobs
are in the store, so none is lost); a remote server keeps its own, and so does a team server started on
this machine by this account (`corral server start --host …`), which commands here use as its admin.
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path

from corral.config import corral_home, write_private
from corral.errors import ConfigError, CorralError

EXAMPLE_URL = "https://corral.example.org:8765"


@dataclass(frozen=True)
class Endpoint:
    url: str  # no trailing slash
    token: str
    local: bool
    cafile: str | None = None  # this machine's team server's own certificate, trusted as it is
    remedy: str = ""  # what to do when it does not answer, from where it was named


def server_url(text: str, named_by: str) -> str:
    """`text` as a server's base URL (http or https, a host, maybe a port and a path), without its
    trailing slash; ConfigError naming `named_by` (where it was given) otherwise."""
    import urllib.parse

    try:
        parts = urllib.parse.urlsplit(text)
        port_ok = parts.port is None or parts.port > 0  # .port raises ValueError for one out of range
    except ValueError:
        port_ok = False
    if not port_ok or parts.scheme not in ("http", "https") or not parts.hostname or parts.query \
            or parts.fragment or any(c.isspace() for c in text):
        raise ConfigError(f"{named_by} {text!r} is not a Corral server's URL; give one such as {EXAMPLE_URL}")
    return text.rstrip("/")


def login_file() -> Path:
    return corral_home() / "api.json"


def save_login(url: str, token: str) -> Path:
    path = login_file()
    write_private(path, json.dumps({"url": url.rstrip("/"), "token": token}) + "\n")
    return path


def forget_login() -> bool:
    path = login_file()
    existed = path.exists()
    path.unlink(missing_ok=True)
    return existed


def remote(url: str | None = None, token: str | None = None) -> Endpoint | None:
    """The remote server named by the arguments, the environment or `api login`; None for the local one."""
    if url:
        return Endpoint(server_url(url, "the URL"), token or os.environ.get("CORRAL_API_TOKEN", ""), False,
                        remedy="check the URL")
    if os.environ.get("CORRAL_API_URL"):
        return Endpoint(server_url(os.environ["CORRAL_API_URL"], "CORRAL_API_URL"),
                        token or os.environ.get("CORRAL_API_TOKEN", ""), False,
                        remedy="check CORRAL_API_URL, or unset it to use the local server")
    try:
        saved = json.loads(login_file().read_text())
        return Endpoint(server_url(str(saved["url"]), f"the URL saved in {login_file()}"),
                        token or str(saved.get("token", "")), False,
                        remedy="check the URL, or `corral api logout`")
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise CorralError(f"{login_file()}: unreadable ({exc}); run `corral api login URL` again, "
                          "or `corral api logout`") from None


def settings() -> dict[str, str]:
    """What a local server must share with the command that calls it."""
    from corral.config import cluster_file_path

    hooks = {k: v for k, v in sorted(os.environ.items()) if k.startswith("CORRAL_TEST_")}  # tests' fault injection
    return {"cluster_file": str(cluster_file_path()), "ssh": shutil.which("ssh") or "",
            "timeout": os.environ.get("CORRAL_TIMEOUT", ""), "store": os.environ.get("CORRAL_DB_URL", ""),
            **({"test_hooks": json.dumps(hooks)} if hooks else {})}


def local() -> Endpoint:
    """This user's local server: started if it does not run, restarted if it runs with other settings."""
    from corral.config import load_registry
    from corral.controller.running import read_endpoint

    endpoint = read_endpoint()
    if endpoint is not None and endpoint.get("team"):
        # A team server runs for this account: commands here (`corral users add`, as its admin) use
        # it as it is; it keeps its own settings, and is never restarted by a command.
        return Endpoint(str(endpoint["url"]), str(endpoint["token"]), True, endpoint.get("cafile"))
    load_registry()  # a missing or malformed cluster file is reported here, as it always was
    wanted = settings()
    if endpoint is not None and endpoint.get("settings") == wanted:
        return Endpoint(f"http://127.0.0.1:{endpoint['port']}", endpoint["token"], True)
    from corral.controller import server  # to start it, or restart it with these settings

    if endpoint is not None:
        server.stop()
    server.start()
    endpoint = server.read_endpoint()
    if endpoint is None:
        raise server.ControllerUnavailable(f"the server did not publish its port; see {server.log_file()}")
    return Endpoint(f"http://127.0.0.1:{endpoint['port']}", endpoint["token"], True)
