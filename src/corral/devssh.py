"""Plain `ssh NAME` (and editors' remote-SSH) into a dev allocation: keys, known hosts, the alias file.

Each allocation gets its own sshd host key, generated here and sent with the holder job; the public
half goes in Corral's own known_hosts under `corral-dev-<token>`, so host keys are checked strictly.
One client key per Corral home (`keys/dev_ed25519`) is the only key the allocation's sshd accepts.
The alias runs that sshd through the login node (`ProxyCommand … srun … sshd -i`), so the client
talks SSH to the head node itself; see `infra/slurm/devscript.session_proxy_script`.
"""

from __future__ import annotations

import shlex
import subprocess
import tempfile
from pathlib import Path

from corral.config import corral_home, private_dir, write_private
from corral.errors import CorralError
from corral.infra.base import SessionKeys

# What the alias copies from the login node's effective ssh settings when it falls back to a
# RemoteCommand entry (a head node without sshd).
_LOGIN_SETTINGS = ["hostname", "port", "user", "identityfile", "identitiesonly", "proxyjump", "userknownhostsfile",
                   "stricthostkeychecking"]


def ssh_alias_file() -> Path:
    return corral_home() / "ssh_config"


def known_hosts_file() -> Path:
    return corral_home() / "known_hosts"


def host_key_alias(token: str) -> str:
    return f"corral-dev-{token}"


def _keygen(path: Path, comment: str) -> None:
    try:
        subprocess.run(["ssh-keygen", "-q", "-t", "ed25519", "-N", "", "-C", comment, "-f", str(path)],
                       check=True, capture_output=True, text=True)
    except FileNotFoundError as exc:
        raise CorralError("ssh-keygen is not installed (it comes with the OpenSSH client)") from exc
    except subprocess.CalledProcessError as exc:
        raise CorralError(f"ssh-keygen failed: {exc.stderr.strip()}") from exc


def dev_identity() -> Path:
    """The client key for dev allocations' sshd, created on first use."""
    path = corral_home() / "keys" / "dev_ed25519"
    if not path.exists():
        private_dir(path.parent)
        _keygen(path, "corral-dev")
    return path


def new_session_keys() -> tuple[SessionKeys, str]:
    """A fresh host key for one allocation: (what goes to the cluster, the host public key)."""
    identity = dev_identity()
    with tempfile.TemporaryDirectory(prefix="corral-hostkey-") as tmp:
        host = Path(tmp) / "host"
        _keygen(host, "corral-dev-host")
        private, public = host.read_text(), host.with_suffix(".pub").read_text().split()
    keys = SessionKeys(host_private_key=private, authorized_key=identity.with_suffix(".pub").read_text())
    return keys, " ".join(public[:2])


def remember_host_key(token: str, public_key: str) -> None:
    path = known_hosts_file()
    entries = _known_hosts(path)
    entries[host_key_alias(token)] = public_key
    _write_known_hosts(path, entries)


def forget_host_key(token: str) -> None:
    path = known_hosts_file()
    entries = _known_hosts(path)
    if entries.pop(host_key_alias(token), None) is not None:
        _write_known_hosts(path, entries)


def _known_hosts(path: Path) -> dict[str, str]:
    if not path.exists():
        return {}
    entries = {}
    for line in path.read_text().splitlines():
        host, _, key = line.partition(" ")
        if host and key:
            entries[host] = key
    return entries


def _write_known_hosts(path: Path, entries: dict[str, str]) -> None:
    write_private(path, "".join(f"{host} {key}\n" for host, key in entries.items()))


def _ssh_config_value(value: str) -> str:
    """A value for an ssh_config line: `%` would be read as a token, spaces need quotes."""
    value = value.replace("%", "%%")
    return f'"{value}"' if any(c.isspace() for c in value) else value


def alias_entry(*, name: str, token: str, cluster: str, partition: str, slurm_job_id: str, head_node: str,
                login_settings: dict[str, list[str]], proxy_argv: list[str] | None, remote_command: str) -> str:
    """One `Host NAME` block. With `proxy_argv` (the head node has sshd), ssh talks to an sshd on the
    head node through the login node; without, it falls back to a shell step (`RemoteCommand`),
    which plain `ssh NAME` can use but editors cannot."""
    lines = [f"Host {name}",
             f"    # corral dev allocation on slurm/{cluster}/{partition}, Slurm job {slurm_job_id}, head node "
             f"{head_node}"]
    if proxy_argv is not None:
        user = login_settings.get("user", [])
        lines += [f"    User {_ssh_config_value(user[0])}"] if user else []
        lines += [f"    HostKeyAlias {host_key_alias(token)}",
                  f"    UserKnownHostsFile {_ssh_config_value(str(known_hosts_file()))}",
                  "    StrictHostKeyChecking yes",
                  f"    IdentityFile {_ssh_config_value(str(dev_identity()))}",
                  "    IdentitiesOnly yes",
                  "    ProxyCommand " + " ".join(shlex.quote(arg) for arg in proxy_argv).replace("%", "%%")]
        return "\n".join(lines)
    lines.append("    # no sshd on the head node: plain ssh works, editors' remote-SSH does not")
    for key in _LOGIN_SETTINGS:
        for value in login_settings.get(key, []):
            if key == "proxyjump" and value == "none":
                continue
            lines.append(f"    {key} {_ssh_config_value(value)}")
    lines += ["    RequestTTY yes", f"    RemoteCommand {remote_command.replace('%', '%%')}"]
    return "\n".join(lines)


def set_alias(name: str, entry: str | None, cluster_file: Path) -> Path:
    """Add, replace or (with None) remove NAME's block in the alias file."""
    path = ssh_alias_file()
    entries = _read_aliases(path)
    if entry is None:
        if entries.pop(name, None) is None:
            return path
    else:
        entries[name] = entry
    header = (f"# Written by Corral: one Host per dev allocation. Add `Include {path}` to ~/.ssh/config.\n"
              f"# Each reaches its allocation's head node through its cluster's login node (from {cluster_file}).\n")
    write_private(path, header + "\n\n".join(entries.values()) + ("\n" if entries else ""))
    return path


def _read_aliases(path: Path) -> dict[str, str]:
    entries: dict[str, str] = {}
    if not path.exists():
        return entries
    current: list[str] = []
    for line in path.read_text().splitlines():
        if line.startswith("Host "):
            if current:
                entries[current[0].split()[1]] = "\n".join(current)
            current = [line]
        elif current and line.strip():
            current.append(line)
    if current:
        entries[current[0].split()[1]] = "\n".join(current)
    return entries
