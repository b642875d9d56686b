"""Issue: security and input hardening, end to end on the real testbed. Each test fails on the code
before the fix: a canary file appeared, a job broke, or a secret sat in the store."""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest

from tests.conftest import wait_for
from tests.helpers import ssh_login


def test_option_like_workdir_and_mounts_run_nothing_locally(corral, corral_env, tmp_path, clean_queues):
    work = tmp_path / "project"
    workdir = work / "-esh -c 'touch pwned' #"
    workdir.mkdir(parents=True)
    (workdir / "code.txt").write_text("code\n")
    (work / "--rsh=sh -c 'touch pwned' #").write_text("data\n")
    (work / "task.yaml").write_text(
        "workdir: \"-esh -c 'touch pwned' #\"\n"
        "file_mounts:\n  data.txt: \"--rsh=sh -c 'touch pwned' #\"\n"
        "run: cat code.txt data.txt\n")
    result = subprocess.run([sys.executable, "-m", "corral", "launch", "task.yaml"], cwd=work, env=corral_env,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "code\ndata\n"
    assert not (work / "pwned").exists() and not (tmp_path / "pwned").exists()


@pytest.mark.parametrize("slurm", [{"account": "x\ntouch ~/CANARY"}, {"qos": "normal\ntouch ~/CANARY"},
                                   {"sbatch_args": ["--comment=x\ntouch ~/CANARY"]},
                                   {"sbatch_args": ["--exclusive --output=/tmp/CANARY"]}])
def test_sbatch_values_cannot_inject_lines(corral, testbed, tmp_path, clean_queues, slurm):
    import yaml

    canary = f"canary-{uuid.uuid4().hex[:8]}"
    text = yaml.safe_dump({"run": "true", "slurm": {k: (v.replace("CANARY", canary) if isinstance(v, str)
                                                         else [a.replace("CANARY", canary) for a in v])
                                                     for k, v in slurm.items()}})
    (tmp_path / "task.yaml").write_text(text)
    result = corral("launch", "-d", str(tmp_path / "task.yaml"))
    assert result.exit_code == 65 and result.stderr.count("\n") == 1 and "invalid task: slurm." in result.stderr
    for cluster in ("alpine", "borealis", "cirrus"):
        assert ssh_login(testbed.cluster_config, cluster, f"ls ~ /tmp | grep -c {canary} || true").strip() == "0"


def test_a_task_env_cannot_break_corrals_own_commands(corral, clean_queues):
    result = corral("launch", "--num-nodes", "2", "--gpus", "H100:1", "--env", "PATH=/nowhere", "--env",
                    "LD_LIBRARY_PATH=/nowhere", "--", 'echo "rank $CORRAL_NODE_RANK path=$PATH"')
    assert result.exit_code == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == ["0: rank 0 path=/nowhere", "1: rank 1 path=/nowhere"]


def store_bytes(home: Path) -> bytes:
    return b"".join(p.read_bytes() for p in home.glob("state.db*") if p.is_file())


def test_secrets_reach_the_job_but_never_the_store_in_clear(corral, corral_env, testbed, clean_queues):
    secret = f"s3cr3t-{uuid.uuid4().hex}"
    home = Path(corral_env["CORRAL_HOME"])
    env = {**corral_env, "WANDB_API_KEY": secret + "-env"}
    result = corral("launch", "--secret", f"HF_TOKEN={secret}", "--secret", "WANDB_API_KEY", "--",
                    'echo "$HF_TOKEN $WANDB_API_KEY"', env=env)
    assert result.exit_code == 0, result.stderr
    assert result.stdout == f"{secret} {secret}-env\n"
    managed = corral("jobs", "launch", "-d", "--secret", f"HF_TOKEN={secret}", "--", 'echo "managed $HF_TOKEN"')
    assert managed.exit_code == 0, managed.stderr
    job = managed.stdout.strip()
    try:
        wait_for("the managed job to succeed",
                 lambda: "SUCCEEDED" in corral("jobs", "events", job).stdout, timeout=90)
        assert corral("jobs", "logs", "--no-follow", job).stdout.strip().endswith(f"managed {secret}")
    finally:
        corral("server", "stop")
    listings = [corral(*args).stdout for args in (["queue", "--json", "--all"], ["jobs", "queue", "--json", "--all"],
                                                  ["jobs", "events", job])]
    stored = store_bytes(home)
    assert stored and secret.encode() not in stored
    assert all(secret not in text for text in listings)
    # On the cluster, the job's env file is the user's alone.
    modes = ssh_login(testbed.cluster_config, "alpine", "stat -c %a ~/.corral/runs/*/env.sh 2>/dev/null | sort -u")
    assert set(modes.split()) <= {"600"}


OTHER_USER = "corral-other"


@pytest.fixture(scope="module")
def other_user() -> str:
    if os.geteuid() != 0:
        pytest.skip("needs root to create a second local user")
    if subprocess.run(["id", OTHER_USER], capture_output=True).returncode != 0:
        subprocess.run(["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", OTHER_USER],
                       check=True)
    return OTHER_USER


def test_another_local_user_can_read_nothing_of_corrals_home(corral_env, testbed, other_user, clean_queues):
    """Run Corral as a careless user would (umask 022, a world-readable store left by an old version),
    then try, as a second local user, to open everything under the first user's Corral home."""
    import sqlite3
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="corral-perm-", dir="/tmp"))
    base.chmod(0o755)  # the second user can reach the home: only its own modes protect it
    home = base / "home"
    home.mkdir(mode=0o755)
    sqlite3.connect(home / "state.db").close()
    (home / "state.db").chmod(0o644)
    env = {**corral_env, "CORRAL_HOME": str(home)}

    def corral(*args: str) -> None:
        proc = subprocess.run([sys.executable, "-m", "corral", *args], env=env, capture_output=True, text=True,
                              timeout=120, preexec_fn=lambda: os.umask(0o022))
        assert proc.returncode == 0, proc.stderr

    try:
        corral("launch", "--env", "TOKEN=plain-env", "--secret", "KEY=secret", "--", "true")
        corral("jobs", "launch", "-d", "--", "true")
        corral("server", "status")
        corral("gpus")
        paths = [home, *home.rglob("*")]
        assert len(paths) > 8, paths
        loose = [(str(p), oct(p.stat().st_mode & 0o777)) for p in paths
                 if p.stat().st_mode & 0o077]
        assert loose == []
        # The second user tries to list every folder and read every file (sockets included) by path.
        probe = ('n=0; for p in "$@"; do if [ -d "$p" ]; then ls "$p" >/dev/null 2>&1 && n=$((n+1)) && echo "$p"; '
                 'elif head -c 1 "$p" >/dev/null 2>&1; then n=$((n+1)); echo "$p"; fi; done; echo "opened $n"')
        seen = subprocess.run(["runuser", "-u", other_user, "--", "sh", "-c", probe, "probe", *map(str, paths)],
                              capture_output=True, text=True, timeout=60)
        assert seen.returncode == 0, seen.stderr
        assert seen.stdout == "opened 0\n", seen.stdout
        # The same probe on a folder of that user's reach does open things: the test can fail.
        control = subprocess.run(["runuser", "-u", other_user, "--", "sh", "-c", probe, "probe", str(base)],
                                 capture_output=True, text=True, timeout=60)
        assert control.stdout.endswith("opened 1\n"), control.stdout
    finally:
        subprocess.run([sys.executable, "-m", "corral", "server", "stop"], env=env, capture_output=True)
        subprocess.run(["rm", "-rf", str(base)])


def test_a_login_node_that_stops_answering_costs_one_timeout(corral, corral_env, testbed):
    """A hung login node behind an open ControlMaster: `gpus` answers within CORRAL_TIMEOUT, with the
    other clusters' rows and that cluster's failure. The next calls do not wait that bound again: the
    cluster is asked again, and waited for a second (client.FAILING_PATIENCE)."""
    env = {**corral_env, "CORRAL_TIMEOUT": "6"}
    assert corral("gpus", "--json", env=env).exit_code == 0  # opens the masters (and the server, with that timeout)
    testbed.freeze_login("alpine")
    try:
        errors, seconds = [], []
        for _ in range(3):
            result = corral("gpus", "--json", env=env)
            rows = result.json()
            failures = {r["cluster"]: r for r in rows if "error" in r}
            # Behind the stuck master: "no answer within 6s"; later, with that master stopped, a new
            # connection that never gets the login node's banner (ConnectTimeout).
            assert set(failures) == {"alpine"} and failures["alpine"]["error_kind"] in ("timeout", "unreachable"), rows
            assert {r["cluster"] for r in rows if "error" not in r} == {"borealis", "cirrus"}
            errors.append(failures["alpine"]["error"])
            seconds.append(result.seconds)
        assert "within 6s" in errors[0], errors  # the bound the user set, not what was left of it after connecting
        assert seconds[0] < 2 * 6, seconds  # one bound plus start-up (10.2 s on a slow host), not two
        assert all("(asked again: no answer in 1 s yet)" in e for e in errors[1:]), errors
        assert max(seconds[1:]) < 6, seconds  # not the bound again
    finally:
        testbed.thaw_login("alpine")
    wait_for("alpine to answer again", lambda: corral("check", "alpine").exit_code == 0, timeout=30)


def test_a_proxy_in_the_users_environment_does_not_come_between_the_cli_and_its_local_server(corral, corral_env):
    dead = "http://127.0.0.1:9"  # the discard port: nothing listens there
    env = {**corral_env, "http_proxy": dead, "HTTP_PROXY": dead, "all_proxy": dead, "ALL_PROXY": dead}
    env.pop("no_proxy", None), env.pop("NO_PROXY", None)
    result = corral("queue", env=env)
    assert result.exit_code == 0, result.stderr


# What people set in their own login profile for their own use of Slurm, each of which would break Corral.
SLURM_HABITS = {
    "SLURM_TIME_FORMAT": "relative",  # "Tomorr 10:00" where Corral reads ISO times
    "SQUEUE_FORMAT": "%.8i %j",
    "SINFO_PARTITION": "b300",  # sinfo would show one partition
    "SBATCH_PARTITION": "b300",  # would beat the `#SBATCH --partition` Corral wrote
    "SBATCH_OUTPUT": "/tmp/corral-test-elsewhere-%j.out",  # the log where Corral never looks
    "SCANCEL_INTERACTIVE": "1",  # scancel would ask, and read the rest of Corral's script as the answer
}
PROFILE_HOOK = "[ -f ~/.corral-test-habits ] && . ~/.corral-test-habits"


@pytest.fixture
def slurm_habits_in_profile(testbed):
    """The test user's login profile exports SLURM_HABITS (the home is shared by the testbed's login nodes)."""
    import shlex

    config = testbed.cluster_config
    lines = " ".join(shlex.quote(f"export {name}={shlex.quote(value)}") for name, value in SLURM_HABITS.items())
    hook = shlex.quote(PROFILE_HOOK)
    ssh_login(config, "cirrus", f"printf '%s\\n' {lines} > ~/.corral-test-habits; "
                                f"grep -qxF {hook} ~/.profile || echo {hook} >> ~/.profile")
    yield
    ssh_login(config, "cirrus", f"rm -f ~/.corral-test-habits; grep -vxF {hook} ~/.profile > ~/.profile.corral-test; "
                                "mv ~/.profile.corral-test ~/.profile")


def test_what_a_users_login_profile_sets_for_their_own_slurm_use_changes_nothing_corral_does(
        corral, testbed, clean_queues, slurm_habits_in_profile):
    from tests.cli.test_launch import launch, queue, wait_state

    config = testbed.cluster_config
    in_effect = ssh_login(config, "cirrus", "bash --login -c 'sinfo -h -o %P; echo $SBATCH_PARTITION'").split()
    assert in_effect == ["b300*", "b300"]  # what a login shell there now does (b300 is the default)
    check = corral("check", "--json", "cirrus")
    assert check.exit_code == 0 and set(check.json()[0]["partitions"]) == {"b300", "debug", "maint"}, check.stdout

    done = corral("launch", "--infra", "slurm/cirrus/debug", "--", "echo hello from debug")
    assert done.exit_code == 0 and "hello from debug" in done.stdout, done.stdout + done.stderr
    job = next(j for j in queue(corral).values() if j["state"] == "SUCCEEDED")
    assert job["partition"] == "debug" and job["started_at"] and job["ended_at"] >= job["started_at"] > 0
    assert corral("logs", "--no-follow", job["job_id"]).stdout == "hello from debug\n"

    running = launch(corral, "--infra", "slurm/cirrus/debug", "--", "sleep 600")["job_id"]
    slurm_id = wait_state(corral, running, {"RUNNING"})["slurm_job_id"]
    assert ssh_login(config, "cirrus", f"squeue -h -j {slurm_id} -o %P").split() == ["debug"]  # Slurm's own word
    cancelled = corral("cancel", running)
    assert cancelled.exit_code == 0 and cancelled.stdout.strip() == f"{running}: cancelled", cancelled.stderr
    wait_state(corral, running, {"CANCELLED"})


@pytest.fixture
def slurm_habits_in_bashrc(testbed):
    """The test user's ~/.bashrc exports SLURM_CLUSTERS before its "not interactive: return" line, as
    people do; Debian's bash reads it for every command ssh runs, login shell or not."""
    line = "export SLURM_CLUSTERS=elsewhere SQUEUE_FORMAT=%j  # corral-test"
    ssh_login(testbed.cluster_config, "cirrus", f"sed -i '1i {line}' ~/.bashrc")
    yield
    ssh_login(testbed.cluster_config, "cirrus", "sed -i '/# corral-test$/d' ~/.bashrc")


def test_corral_ssh_and_the_ssh_alias_are_not_sent_elsewhere_by_the_users_bashrc(
        corral, corral_env, testbed, clean_queues, slurm_habits_in_bashrc):
    plain = ssh_login(testbed.cluster_config, "cirrus", "srun -N1 -p debug hostname 2>&1; echo $SLURM_CLUSTERS")
    assert "'elsewhere' can't be reached" in plain and plain.endswith("elsewhere\n")  # what they do to srun
    up = corral("launch", "-c", "box", "--infra", "slurm/cirrus/b300")
    assert up.exit_code == 0, up.stderr
    try:
        ran = corral("ssh", "box", "--", 'hostname; echo "done!"')  # `!`: a csh login shell's history
        assert (ran.exit_code, ran.stdout) == (0, "c1\ndone!\n"), ran.stderr
        alias = corral_env["CORRAL_HOME"] + "/ssh_config"  # plain `ssh box`: the ProxyCommand's srun
        through = subprocess.run(["ssh", "-F", alias, "box", "hostname"], capture_output=True, text=True, timeout=60,
                                 check=False)
        assert (through.returncode, through.stdout) == (0, "c1\n"), through.stderr
    finally:
        assert corral("down", "box").exit_code == 0


def test_a_terminal_that_cannot_show_unicode_gets_question_marks_not_a_crash(corral, corral_env):
    """A latin-1 locale or PYTHONIOENCODING=ascii: the plan's arrow cannot be encoded."""
    env = {**corral_env, "PYTHONIOENCODING": "ascii"}
    plan = corral("launch", "--dryrun", "--infra", "slurm/alpine/cpu", "--", "true", env=env)
    assert plan.exit_code == 0, plan.stderr
    assert any(line.split()[:2] == ["?", "slurm/alpine/cpu"] for line in plan.stdout.splitlines()), plan.stdout


@pytest.mark.parametrize(("argv", "expected"), [
    (["sbatch"], (0, "Usage: corral sbatch")),  # nothing given, nothing to read: the usage, as for a terminal
    (["sbatch", "-t", "5"], (65, "no script given")),
    (["api", "login", "http://127.0.0.1:9"], (2, "no token given")),
])
def test_a_closed_standard_input_is_no_script_and_no_token(corral_env, tmp_path, argv, expected):
    """`corral sbatch <&-` (sys.stdin is None) was an internal error where a script may come on stdin."""
    env = {**corral_env, "CORRAL_HOME": str(tmp_path / "home")}
    ran = subprocess.run([sys.executable, "-m", "corral", *argv], env=env, capture_output=True, text=True,
                         timeout=60, preexec_fn=lambda: os.close(0))
    assert ran.returncode == expected[0], ran.stderr
    assert expected[1] in ran.stdout + ran.stderr and "Traceback" not in ran.stderr
