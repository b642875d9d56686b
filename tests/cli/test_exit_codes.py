"""Exit codes per error class (docs/cli.md): a script tells a bad task (65), a name that does not exist
(66), nothing available (69), refused credentials (77) and a broken cluster file (78) apart, and all of
them apart from a job's own exit code. The clusters refuse connections at once: no testbed needed."""

from __future__ import annotations

import pytest

from tests.helpers import run_cli

CASES = [
    (["launch", "-d", "bad.yaml"], 65, "did you mean 'accelerators'"),
    (["launch", "-d", "missing.yaml"], 65, "missing.yaml: task file not found"),
    (["sbatch", "missing.sh"], 65, "missing.sh: job script not found"),
    (["cancel"], 2, "name the jobs to cancel, or use --all"),
    (["down"], 2, "name the allocations to release, or use --all"),
    (["launch", "-d", "-c", "bad/name", "--", "true"], 65, "invalid allocation name 'bad/name'"),
    (["launch", "-d", "--env", "NOEQUALS", "--", "true"], 65, "NOEQUALS is not set in your environment"),
    (["launch", "-d", "--env-file", "no-such.env", "--", "true"], 65, "--env-file no-such.env: cannot read it"),
    (["launch", "-d", "--num-jobs", "0", "--", "true"], 65, "a sweep has 1 to 10,000 jobs"),
    (["launch", "--no-such-flag"], 2, "No such option"),
    # SkyPilot's commands that mean nothing on Slurm say what to type instead; its show-gpus is gpus.
    (["stop", "dev"], 2, "Corral has no `stop` (SkyPilot's): a Slurm allocation cannot be stopped"),
    (["autostop", "dev", "-i", "5"], 66, "no dev allocation 'dev'"),  # SkyPilot's `sky autostop`
    (["autostop"], 2, "name the allocations, or use --all"),
    (["show-gpus", "--help"], 0, ""),
    (["launch", "--detach-run", "-s", "--idle-minutes-to-autostop", "5", "--dryrun", "--infra", "slurm/alpine/gpu",
      "--", "true"], 69, "no cluster can run this task"),  # SkyPilot's long flag names (alpine refuses connections)
    (["logs", "c-nope"], 66, "no job 'c-nope'"),
    (["jobs", "why", "c-nope"], 66, "no managed job 'c-nope'"),
    (["launch", "-d", "--infra", "slurm/nope", "--", "true"], 66, "unknown cluster 'nope'"),
    (["launch", "-d", "task.yaml"], 69, "no cluster can run this task"),
    # a dry run no place can carry out fails as its launch would, and as `sbatch --test-only` does (it was 0)
    (["launch", "--dryrun", "--infra", "slurm/alpine/gpu", "--", "true"], 69,
     "no cluster can run this task: each row of the plan says why"),
    # --dryrun says what the launch would refuse, not a plan it cannot carry out
    (["launch", "--dryrun", "secret.yaml"], 65, "secrets HF_TOKEN must be given a value: pass --secret HF_TOKEN"),
    (["server", "start", "--db", "postgresql://db/corral"], 78, "for a team server: give --host and --port"),
    (["server", "start", "--port", "1", "--db", "mysql://db/corral"], 78, "give a PostgreSQL URL"),
    (["server", "start", "--port", "1", "--trusted-proxy", "the proxy"], 78, "not an address or network"),
    (["server", "start", "--port", "1", "--tls-cert", "task.yaml"], 78, "give both --tls-cert and --tls-key"),
]


@pytest.mark.parametrize("argv, code, says", CASES, ids=lambda v: " ".join(v) if isinstance(v, list) else None)
def test_each_error_class_has_its_exit_code(refusing_clusters, argv, code, says):
    exit_code, _out, err = run_cli(argv)
    assert exit_code == code, err
    assert says in err
    if code:
        assert err.count("corral: error:") == 1 and "Traceback" not in err


def test_an_unreachable_server_is_69_and_a_refused_token_77(refusing_clusters, monkeypatch):
    monkeypatch.setenv("CORRAL_API_URL", "http://127.0.0.1:9")
    code, _out, err = run_cli(["queue"])
    assert code == 69 and "http://127.0.0.1:9 did not answer" in err
    monkeypatch.delenv("CORRAL_API_URL")
    assert run_cli(["api", "info"])[0] == 0  # the local server runs
    from corral.controller.server import read_endpoint

    endpoint = read_endpoint()
    assert endpoint is not None
    monkeypatch.setenv("CORRAL_API_URL", f"http://127.0.0.1:{endpoint['port']}")
    monkeypatch.setenv("CORRAL_API_TOKEN", "wrong")
    code, _out, err = run_cli(["queue"])
    assert code == 77 and "refused the token" in err


def test_a_broken_cluster_file_is_78(refusing_clusters, monkeypatch):
    broken = refusing_clusters / "broken-config"
    broken.write_text("Host alpine\n    HostName\n")
    monkeypatch.setenv("CORRAL_SLURM_CONFIG", str(broken))
    code, _out, err = run_cli(["queue"])
    assert code == 78 and str(broken) in err
