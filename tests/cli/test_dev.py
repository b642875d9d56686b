"""Dev allocations: `launch -c`, `exec`, `ssh`, `status`, `down`, idle autodown, on the real testbed."""

from __future__ import annotations

import subprocess
import sys

import pexpect
import pytest

from tests.conftest import wait_for
from tests.helpers import job_state, ssh_login


@pytest.fixture
def clean(testbed, corral):
    yield
    for spec in testbed.clusters:
        subprocess.run(["ssh", "-F", str(testbed.cluster_config), spec.name, "scancel -u corral-test"],
                       capture_output=True)


def status(corral, name: str) -> dict:
    result = corral("status", "--json")
    assert result.exit_code == 0, result.stderr
    return next(s for s in result.json() if s["name"] == name)


def test_allocation_lands_where_capacity_is_and_exec_runs_on_every_node(corral, testbed, clean):
    full = ssh_login(testbed.cluster_config, "alpine",
                     "sbatch --parsable -p gpu -N2 --gres=gpu:nvidia_h100_80gb_hbm3:4 --wrap 'sleep 600'").strip()
    wait_for("alpine to be full", lambda: job_state(testbed.cluster_config, "alpine", full) == "RUNNING")
    up = corral("launch", "-c", "dev", "--gpus", "H100:2", "--num-nodes", "2", "--json")
    assert up.exit_code == 0, up.stderr
    info = up.json()
    assert (info["cluster"], info["partition"], info["new"], info["nodes"]) == ("borealis", "h100-cluster", True,
                                                                               ["b1", "b2"])
    script = ('echo "rank=$CORRAL_NODE_RANK host=$(hostname) n=$CORRAL_NUM_NODES gpus=$CORRAL_NUM_GPUS_PER_NODE '
              'cvd=$CUDA_VISIBLE_DEVICES ips=$(echo $CORRAL_NODE_IPS | tr " " ,) cluster=$CORRAL_CLUSTER"')
    result = corral("exec", "dev", "--", script)
    assert result.exit_code == 0, result.stderr
    assert sorted(result.stdout.splitlines()) == [
        "rank=0 host=b1 n=2 gpus=2 cvd=0,1 ips=127.0.0.1,127.0.0.1 cluster=borealis",
        "rank=1 host=b2 n=2 gpus=2 cvd=0,1 ips=127.0.0.1,127.0.0.1 cluster=borealis",
    ]
    assert corral("exec", "dev", "--", "exit 4").exit_code == 4
    jobs = corral("queue", "dev", "--json").json()
    assert [(j["state"], j["exit_code"]) for j in jobs] == [("SUCCEEDED", 0), ("FAILED", 4)]
    assert all(j["cluster"] == "borealis" for j in jobs)
    # Same name, same resources: reused, no second allocation; the task just runs in it.
    again = corral("launch", "-c", "dev", "--gpus", "H100:2", "--num-nodes", "2", "--", "hostname")
    assert again.exit_code == 0, again.stderr
    assert sorted(again.stdout.split()) == ["b1", "b2"]
    assert status(corral, "dev")["slurm_job_id"] == info["slurm_job_id"]
    other = corral("launch", "-c", "dev", "--gpus", "H100:1")
    assert other.exit_code == 1
    assert "allocation 'dev' exists with other resources (accelerator=H100:2, num_nodes=2); asked for " \
           "accelerator=H100:1, num_nodes=1" in other.stderr
    down = corral("down", "dev")
    assert down.exit_code == 0 and down.stdout.strip() == "dev: released"
    assert job_state(testbed.cluster_config, "borealis", info["slurm_job_id"]) == "CANCELLED"
    gone = corral("down", "dev")
    assert gone.exit_code == 0 and gone.stderr.strip() == "dev: no such allocation (already down)"


def test_ssh_into_the_head_node(corral, corral_env, clean):
    up = corral("launch", "-c", "box", "--infra", "slurm/cirrus/b300", "--num-nodes", "2", "--json")
    assert up.exit_code == 0, up.stderr
    result = corral("ssh", "box", "--", "hostname")
    assert result.exit_code == 0 and result.stdout.strip() == "c1"
    shell = pexpect.spawn(sys.executable, ["-m", "corral", "ssh", "box"], env=corral_env, encoding="utf-8",
                          timeout=30)
    try:
        shell.sendline("echo marker-$(hostname)-$SLURM_JOB_ID")
        shell.expect(rf"marker-c1-{up.json()['slurm_job_id']}")
        shell.sendline("exit")
        shell.expect(pexpect.EOF)
    finally:
        shell.close(force=True)
    # The ssh alias file for plain `ssh box`.
    alias = (corral_env["CORRAL_HOME"] + "/ssh_config")
    text = open(alias).read()
    assert "Host box" in text and f"srun --jobid={up.json()['slurm_job_id']} --overlap" in text
    plain = pexpect.spawn("ssh", ["-F", alias, "box"], encoding="utf-8", timeout=30)
    try:
        plain.sendline("hostname")
        plain.expect("c1")
        plain.sendline("exit")
        plain.expect(pexpect.EOF)
    finally:
        plain.close(force=True)
    assert corral("down", "box").exit_code == 0
    assert "Host box" not in open(alias).read()


def test_idle_autodown_but_not_while_an_exec_job_runs(corral, clean):
    up = corral("launch", "-c", "idler", "--infra", "slurm/alpine/cpu", "--idle-minutes", "0.25", "--json")
    assert up.exit_code == 0, up.stderr
    busy = corral("exec", "idler", "--", "sleep 35; echo done")  # longer than the 15 s idle limit
    assert busy.exit_code == 0 and busy.stdout.strip() == "done"
    assert status(corral, "idler")["state"] == "READY"  # it did not go down under the exec job
    ended = wait_for("the idle allocation to be released",
                     lambda: (s := status(corral, "idler"))["state"] == "ENDED" and s, timeout=60)
    assert ended["reason"] == "released after being idle"


def test_node_death_and_walltime_end_are_shown(corral, testbed, clean):
    short = corral("launch", "-c", "short", "--infra", "slurm/cirrus/debug", "--time", "1", "--json")
    assert short.exit_code == 0, short.stderr
    doomed = corral("launch", "-c", "doomed", "--infra", "slurm/alpine/inference", "--json")
    assert doomed.exit_code == 0, doomed.stderr
    testbed.kill_node("a4")
    try:
        failed = wait_for("the node failure to show", lambda: (s := status(corral, "doomed"))["state"] != "READY" and s,
                          timeout=120, interval=2)
        assert (failed["state"], failed["reason"]) == ("FAILED", "a node failed")
        timed_out = wait_for("the walltime to end", lambda: (s := status(corral, "short"))["state"] != "READY" and s,
                             timeout=120, interval=2)
        assert (timed_out["state"], timed_out["reason"]) == ("ENDED", "walltime ended")
        exec_after = corral("exec", "short", "--", "true")
        assert exec_after.exit_code == 1 and "allocation 'short' is not ready" in exec_after.stderr
    finally:
        testbed.start_node("a4")
        testbed.resume("a4")


def test_unknown_allocation_names_the_known_ones(corral, clean):
    assert corral("launch", "-c", "known", "--infra", "slurm/alpine/cpu", "-d").exit_code == 0
    result = corral("exec", "nope", "--", "true")
    assert result.exit_code == 1
    assert result.stderr.strip() == ("corral: error: no dev allocation 'nope'; allocations: known "
                                     "(create one with `corral launch -c nope`)")
    assert "no dev allocation 'nope'" in corral("ssh", "nope").stderr
    assert corral("launch", "-c", "bad name!").stderr.strip().startswith("corral: error: invalid allocation name")
    corral("down", "known")
