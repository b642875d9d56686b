"""The ssh alias entries and Corral's known_hosts for dev allocations."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from corral import devssh


@pytest.fixture(autouse=True)
def home(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("CORRAL_HOME", str(tmp_path / "corral home"))
    return tmp_path / "corral home"


LOGIN = {"hostname": ["127.0.0.1"], "port": ["47222"], "user": ["corral-test"], "proxyjump": ["none"],
         "identityfile": ["/keys/id 1"]}


def entry(proxy: list[str] | None) -> str:
    return devssh.alias_entry(name="box", token="tok", cluster="cirrus", partition="b300", slurm_job_id="9",
                              head_node="c1", login_settings=LOGIN, proxy_argv=proxy,
                              remote_command="srun --jobid=9 --overlap -w c1 --pty bash -l")


def test_proxy_entry_checks_the_allocation_host_key_and_escapes_tokens(home: Path):
    text = entry(["ssh", "-F", "/etc/my clusters", "-o", "ControlPath=/tmp/%C", "cirrus", 'srun … bash "$HOME"/x'])
    assert text.splitlines()[2:] == [
        "    User corral-test",
        "    HostKeyAlias corral-dev-tok",
        f'    UserKnownHostsFile "{home}/known_hosts"',
        "    StrictHostKeyChecking yes",
        f'    IdentityFile "{home}/keys/dev_ed25519"',
        "    IdentitiesOnly yes",
        "    ProxyCommand ssh -F '/etc/my clusters' -o ControlPath=/tmp/%%C cirrus 'srun … bash \"$HOME\"/x'",
    ]
    # ssh itself reads the entry back as written (tokens and quotes included).
    config = home / "cfg"
    config.write_text(text + "\n")
    seen = subprocess.run(["ssh", "-G", "-F", str(config), "box"], capture_output=True, text=True, check=True).stdout
    assert "proxycommand ssh -F '/etc/my clusters' -o ControlPath=/tmp/%%C cirrus" in seen
    assert "hostkeyalias corral-dev-tok" in seen


def test_without_sshd_the_entry_falls_back_to_a_shell_step():
    text = entry(None)
    assert "    RemoteCommand srun --jobid=9 --overlap -w c1 --pty bash -l" in text
    assert '    identityfile "/keys/id 1"' in text and "proxyjump" not in text
    assert "editors' remote-SSH does not" in text


def test_aliases_and_host_keys_are_added_and_removed(home: Path):
    keys, public = devssh.new_session_keys()
    assert keys.host_private_key.startswith("-----BEGIN OPENSSH PRIVATE KEY-----")
    assert keys.authorized_key == (home / "keys" / "dev_ed25519.pub").read_text()
    assert oct((home / "keys").stat().st_mode & 0o777) == "0o700"
    devssh.remember_host_key("tok", public)
    devssh.remember_host_key("other", "ssh-ed25519 AAAA")
    devssh.forget_host_key("tok")
    assert (home / "known_hosts").read_text() == "corral-dev-other ssh-ed25519 AAAA\n"
    path = devssh.set_alias("box", entry(None), Path("/clusters"))
    devssh.set_alias("two", entry(None).replace("Host box", "Host two"), Path("/clusters"))
    devssh.set_alias("box", None, Path("/clusters"))
    text = path.read_text()
    assert "Host two" in text and "Host box" not in text
