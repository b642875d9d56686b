"""A login shell's environment, learned once and replayed: the replay through a real bash, and the
transport on the testbed's login nodes (whose profile sets PATH, MODULEPATH and `module`)."""

from __future__ import annotations

import asyncio
import subprocess

import pytest

from corral.config import load_registry
from corral.errors import ConfigError
from corral.login_env import CAPTURE, LOGIN_ENVS, MARK, LoginEnvs, replay, split_capture
from corral.ssh import SshTransport

TRICKY = {
    "QUOTED": "it's \"quoted\" and $(touch ran) `touch ran` $HOME",
    "LINES": "one\ntwo\n",
    "EMPTY": "",
    "UNICODE": "héllo wörld",
    "SLURM_CONF": "/etc/slurm/slurm.conf",
}


def captured_text(env: dict[str, str]) -> str:
    """What `env -0` prints for `env` (as the capture block writes it)."""
    return "".join(f"{name}={value}\0" for name, value in env.items())


def bash_env(script: str) -> dict[str, str]:
    """The environment a clean `bash --noprofile --norc -s` has after `script`."""
    done = subprocess.run(["env", "-i", "PATH=/usr/bin:/bin", "bash", "--noprofile", "--norc", "-s"],
                          input=script + "env -0\n", capture_output=True, text=True, check=True)
    return dict(entry.split("=", 1) for entry in done.stdout.split("\0") if "=" in entry)


def test_a_replayed_environment_has_every_value_byte_for_byte_and_runs_none_of_them(tmp_path):
    env = {**TRICKY, "PATH": "/opt/site/bin:/usr/bin:/bin",
           "SSH_CONNECTION": "10.0.0.1 1 10.0.0.2 22", "KRB5CCNAME": "FILE:/tmp/krb5cc_1_old", "PWD": "/old",
           "SUDO_USER": "svc", "SHLVL": "2", "not-a-name": "x", "BASH_FUNC_site_hello%%": "() {  echo hello from $1\n}"}
    shown = bash_env(f"cd {tmp_path}\n" + replay(captured_text(env)) + "site_hello site > said\n")
    for name, value in {**TRICKY, "PATH": env["PATH"]}.items():
        assert shown[name] == value, name
    assert not any(name in shown for name in ("SSH_CONNECTION", "KRB5CCNAME", "SUDO_USER", "not-a-name"))
    assert shown["PWD"] != "/old" and shown["SHLVL"] == "1"  # bash's own, not the old session's
    assert (tmp_path / "said").read_text() == "hello from site\n"  # the function, exported again
    assert "BASH_FUNC_site_hello%%" in shown  # and so passed on to sbatch, and by it to the job
    assert not (tmp_path / "ran").exists()


def test_a_capture_without_path_is_not_learned():
    envs = LoginEnvs()
    envs.learn(("k",), "env: invalid option -- '0'\n")
    assert envs.get(("k",)) is None and replay("HOME=/h\0") is None


def test_the_capture_comes_out_of_stderr_and_the_rest_stays():
    stderr = f"banner\n{MARK}\0PATH=/bin\0HOME=/h\0{MARK}\nsbatch: error: boom\n"
    captured, rest = split_capture(stderr)
    assert captured == "PATH=/bin\0HOME=/h\0" and rest == "banner\nsbatch: error: boom\n"
    assert split_capture(f"{MARK}\0PATH=/bin\0") == (None, f"{MARK}\0PATH=/bin\0")  # cut short: not used
    assert split_capture("plain\n") == (None, "plain\n")


def test_a_learned_environment_lapses_and_can_be_forgotten(monkeypatch):
    envs = LoginEnvs()
    envs.learn(("k",), "PATH=/bin\0", now=100.0)
    assert envs.get(("k",), now=100.0 + 600) is not None and envs.get(("k",), now=100.0 + 601) is None
    monkeypatch.setenv("CORRAL_LOGIN_ENV_SECONDS", "0")
    assert envs.get(("k",), now=100.0) is None
    for wrong in ("ten", "-1", "nan"):
        monkeypatch.setenv("CORRAL_LOGIN_ENV_SECONDS", wrong)
        with pytest.raises(ConfigError, match=f"CORRAL_LOGIN_ENV_SECONDS='{wrong}' is not a number of seconds"):
            envs.get(("k",))
    monkeypatch.delenv("CORRAL_LOGIN_ENV_SECONDS")
    envs.forget(("k",))
    assert envs.get(("k",), now=100.0) is None


def test_the_capture_block_runs_in_a_real_login_shell():
    done = subprocess.run(["bash", "--login", "-s"], input=CAPTURE + "echo out\n", capture_output=True, text=True)
    captured, rest = split_capture(done.stderr)
    assert done.stdout == "out\n" and captured is not None and replay(captured) is not None


SHOW = ('shopt -q login_shell && echo login || echo plain; printf "%s\\n" "$PATH" "$MODULEPATH" "$SLURM_CONF"; '
        'type -t module; command -v sbatch')


@pytest.fixture
def transport(testbed, corral_env):
    LOGIN_ENVS._known.clear()
    yield SshTransport(load_registry(testbed.cluster_config), timeout=10)
    LOGIN_ENVS._known.clear()


def shown(transport: SshTransport, script: str = SHOW, cluster: str = "cirrus"):
    result = asyncio.run(transport.run(cluster, script, timeout=20, check=False))
    return result.stdout.splitlines(), result


def test_after_the_first_call_scripts_skip_the_profile_and_see_what_it_set(transport, monkeypatch):
    first, result = shown(transport)
    assert first[0] == "login" and result.stderr == ""  # the capture never reaches a caller
    second, _ = shown(transport)
    assert second[0] == "plain" and second[1:] == first[1:]
    assert "/cirrus/runtime-bin" in second[1] and second[2].endswith("/cirrus/modules") and second[4] == "function"
    assert transport.round_trips["cirrus"] == 2
    # A missing command may mean a changed profile: the next call is a login shell again, and learns.
    assert shown(transport, "no-such-command-here")[1].exit_status == 127
    assert shown(transport)[0][0] == "login" and shown(transport)[0][0] == "plain"
    monkeypatch.setenv("CORRAL_LOGIN_ENV_SECONDS", "0")
    assert shown(transport)[0][0] == "login"


def test_a_job_submitted_from_the_replayed_environment_inherits_it(transport, testbed):
    shown(transport)  # learn
    script = ('shopt -q login_shell && echo login || echo plain\n'
              'sbatch --parsable -p debug --wait -o "$HOME/login-env-%j.out" <<"EOF"\n'
              '#!/bin/bash\n'
              'printf "%s\\n" "$MODULEPATH" "$(type -t module)"\n'
              'EOF\n')
    lines, result = shown(transport, script)
    assert lines[0] == "plain", result.stderr
    job = lines[-1].strip()
    out, _ = shown(transport, f'cat "$HOME/login-env-{job}.out"; rm -f "$HOME/login-env-{job}.out"')
    assert out[0].endswith("/cirrus/modules") and out[1] == "function"  # for a setup_prefix's `module load`


def test_members_under_sudo_keep_the_login_shell_their_sudoers_rule_names(transport):
    from corral.accounts import Login, SubmitMode

    member = transport.acting_as(Login("corral-bob", SubmitMode.SUDO))
    assert member._login_env_key("cirrus") is None  # never learned, never replayed: `bash --login -s`
    assert transport._login_env_key("cirrus") != transport.acting_as(
        Login("corral-bob", SubmitMode.SSH, None))._login_env_key("cirrus")  # each account its own


def test_a_stream_uses_the_learned_environment_and_never_captures_one(transport):
    def streamed() -> str:
        chunks: list[bytes] = []
        status = asyncio.run(transport.stream("cirrus", SHOW, chunks.append))
        assert status == 0
        return b"".join(chunks).decode()

    first = streamed().splitlines()
    assert first[0] == "login" and not LOGIN_ENVS._known  # its stderr is read last: nothing written there
    shown(transport)  # a call learns it
    assert streamed().splitlines() == ["plain", *first[1:]]


def test_the_login_nodes_facts_are_asked_for_once_per_login_environment(transport):
    from corral.infra.slurm.cluster import SlurmInfra

    sent: list[str] = []
    run = transport.run

    async def recording(cluster, script, **kwargs):
        sent.append(script)
        return await run(cluster, script, **kwargs)

    transport.run = recording
    infra = SlurmInfra("cirrus", transport)
    first = asyncio.run(infra.probe())
    second = asyncio.run(infra.probe(paths=("~",)))
    assert "srun --help" in sent[0] and "sinfo --version" in sent[0]
    assert "srun --help" not in sent[1] and "sinfo --version" not in sent[1]
    facts = ("slurm_version", "container_runtimes", "home_filesystem")
    assert [getattr(second, f) for f in facts] == [getattr(first, f) for f in facts]
    assert first.slurm_version.startswith("22.") and "apptainer" in first.container_runtimes  # cirrus has it
    assert second.existing_paths == {"~"}  # a task's own paths are still asked for every time
    asyncio.run(infra.probe(associations=True))  # `corral check` always asks
    assert "srun --help" in sent[2]
    LOGIN_ENVS.forget(transport._login_env_key("cirrus"))  # gone with the environment
    asyncio.run(infra.probe())
    assert "srun --help" in sent[3]
