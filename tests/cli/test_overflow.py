"""One plan across kinds, end to end: with every node of the three Slurm clusters taken, a sweep of 100
jobs lands on the SSH pool and the Kubernetes context (the FAKE API server of testbed/kubeapi.py), and
each job runs exactly once: each writes a file named by its job id with noclobber, so a second run of
the same job would fail."""

from __future__ import annotations

import json
import subprocess
from collections import Counter

from tests.cli.test_kube import kube_settings
from tests.conftest import POOL
from tests.conftest import wait_for
from tests.helpers import fill_every_node, job_state, launch_managed, ssh_login


def test_a_sweep_with_every_slurm_cluster_full_overflows_and_runs_each_job_once(corral, corral_env, kube, machines,
                                                                                testbed, tmp_path):
    config = tmp_path / "cluster-file"
    config.write_text(testbed.cluster_config.read_text() + "\n" + machines.ssh_config.read_text())
    home = tmp_path / "corral-home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(json.dumps({**POOL, **kube_settings(kube)}))
    env = {**corral_env, "CORRAL_SLURM_CONFIG": str(config)}
    out = testbed.paths.root / "overflow-sweep"  # the same path on the machines (one filesystem) and in pods
    subprocess.run(["rm", "-rf", str(out)], check=True)
    out.mkdir()
    out.chmod(0o1777)
    task = tmp_path / "sweep.yaml"
    task.write_text(json.dumps({
        "name": "overflow", "resources": {"cpus": 1},
        "run": f'set -C; echo "$CORRAL_CLUSTER" > {out}/"$CORRAL_TASK_ID" || exit 1; sleep 1',
        "config": {"kubernetes": {"pod_config": {"spec": {
            "containers": [{"volumeMounts": [{"name": "out", "mountPath": str(out)}]}],
            "volumes": [{"name": "out", "hostPath": {"path": str(out)}}]}}}},
    }))
    blockers = fill_every_node(testbed.cluster_config)
    try:
        launched = corral("launch", "-d", "--json", "--num-jobs", "100", str(task), env=env, timeout=120)
        assert launched.exit_code == 0, launched.stderr
        ids = [share["job_id"] for share in launched.json()]
        assert len(set(ids)) == 100
        assert set(Counter(share["cluster"] for share in launched.json())) == {"lab", "kind-fake"}

        def ended() -> list[dict]:
            jobs = [j for j in corral("queue", "--json", "--limit", "500", env=env).json() if j["job_id"] in ids]
            return jobs if all(j["state"] in ("SUCCEEDED", "FAILED", "CANCELLED") for j in jobs) else []

        jobs = wait_for("every job to end", ended, timeout=180, interval=2)
        assert Counter(j["state"] for j in jobs) == {"SUCCEEDED": 100}, [j for j in jobs if j["state"] != "SUCCEEDED"]
        assert {j["infra"] for j in jobs} == {"ssh/lab", "k8s/kind-fake"}
        written = {path.name: path.read_text().strip() for path in out.iterdir()}
        assert sorted(written) == sorted(ids)  # each job once: a second run could not have written its file
        assert {j["job_id"]: j["cluster"] for j in jobs} == written
    finally:
        for cluster, jobs in blockers.items():
            ssh_login(testbed.cluster_config, cluster, "scancel " + " ".join(jobs))
        subprocess.run(["corral", "cancel", "--all"], env=env, capture_output=True)


def test_a_managed_job_moves_to_a_pool_machine_that_frees_up_and_back(corral, corral_env, machines, testbed,
                                                                      tmp_path):
    """L4s: alpine's two (its `inference` node) and lab3's two. With all four taken, a managed L4 job waits
    on alpine (Slurm predicts a start, the pool cannot). lab3 frees up: the controller moves the job there.
    Then alpine frees up and lab3 goes away: the job fails there as the machine's doing and comes back
    to alpine."""
    config = tmp_path / "cluster-file"
    config.write_text(testbed.cluster_config.read_text() + "\n" + machines.ssh_config.read_text())
    home = tmp_path / "corral-home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(json.dumps(POOL))
    env = {**corral_env, "CORRAL_SLURM_CONFIG": str(config), "CORRAL_CONTROLLER_INTERVAL": "1",
           "CORRAL_CONTROLLER_GRACE_SECONDS": "6", "CORRAL_CONTROLLER_REROUTE_AFTER": "2",
           "CORRAL_CONTROLLER_REROUTE_COOLDOWN": "5", "CORRAL_CONTROLLER_PREDICT_INTERVAL": "2"}
    alpine_l4 = ssh_login(testbed.cluster_config, "alpine",
                          "sbatch -o /dev/null --parsable -p inference -N1 --exclusive -t 50 --wrap 'sleep 1800'").strip()
    pool_l4 = corral("launch", "-d", "--json", "--infra", "ssh/lab", "--gpus", "L4:2", "--", "sleep 600", env=env)
    assert pool_l4.exit_code == 0, pool_l4.stderr
    try:
        job, managed = launch_managed(corral, env, tmp_path / "mover.yaml", {
            "name": "mover", "resources": {"accelerators": "L4:1"},
            "run": 'n=$(cat "$CORRAL_CHECKPOINT_DIR/n" 2>/dev/null || echo 0); n=$((n + 1)); '
                   'echo "$n" > "$CORRAL_CHECKPOINT_DIR/n"; echo "on $CORRAL_CLUSTER $(hostname) run $n"; sleep 600'})
        waiting = wait_for("the job to wait on alpine", lambda: (j := managed())["state"] == "PENDING"
                           and j["cluster"] == "alpine" and j["slurm_job_id"] and j, 60)
        assert waiting["moves"] == 0
        corral("cancel", pool_l4.json()["job_id"], env=env)  # lab3's L4s free up
        on_pool = wait_for("the job to move to the pool", lambda: (j := managed())["state"] == "RUNNING"
                           and j["cluster"] == "lab" and j, 90)
        assert on_pool["slurm_job_id"].startswith("lab3/") and on_pool["moves"] == 1
        story = [e["reason"] or "" for e in corral("jobs", "events", job, "--json", env=env).json()]
        assert any(r.startswith("re-routed to ssh/lab") for r in story), story
        wait_for("alpine's attempt to be cancelled", lambda: job_state(testbed.cluster_config, "alpine",
                                                                       waiting["slurm_job_id"]) == "CANCELLED")
        # Back: alpine frees up, and lab3 goes away with the job on it.
        ssh_login(testbed.cluster_config, "alpine", f"scancel {alpine_l4}")
        machines.stop_machine("lab3")
        try:
            back = wait_for("the job to come back to alpine", lambda: (j := managed())["state"] == "RUNNING"
                            and j["cluster"] == "alpine" and j, 120)
        finally:
            machines.start_machine("lab3")
        story = [e["reason"] or "" for e in corral("jobs", "events", job, "--json", env=env).json()]
        assert any("MACHINE_DOWN" in r for r in story), story
        assert "checkpoint copied from lab to alpine" in story, story  # from a machine of the pool that has it
        assert back["recoveries"] >= 1
        assert "on alpine a4 run 2" in wait_for("its output on alpine", lambda: corral(
            "jobs", "logs", "--no-follow", job, env=env).stdout, 30)
    finally:
        ssh_login(testbed.cluster_config, "alpine", f"scancel {alpine_l4}")
        corral("jobs", "cancel", "--all", env=env)
        subprocess.run(["corral", "cancel", "--all"], env=env, capture_output=True)
        subprocess.run(["corral", "server", "stop"], env=env, capture_output=True)
