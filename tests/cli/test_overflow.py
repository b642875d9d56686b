"""One plan across kinds, end to end: with every node of the three Slurm clusters taken, a sweep of 100
jobs lands on the SSH pool and the Kubernetes context (the FAKE API server of testbed/kubeapi.py), and
each job runs exactly once: each writes a file named by its job id with noclobber, so a second run of
the same job would fail."""

from __future__ import annotations

import json
import subprocess
from collections import Counter

from tests.cli.test_kube import kube_settings
from tests.cli.test_pools import POOL
from tests.conftest import wait_for
from tests.helpers import fill_every_node, ssh_login


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
        assert Counter(j["state"] for j in jobs) == {"SUCCEEDED": 100}
        assert {j["infra"] for j in jobs} == {"ssh/lab", "k8s/kind-fake"}
        written = {path.name: path.read_text().strip() for path in out.iterdir()}
        assert sorted(written) == sorted(ids)  # each job once: a second run could not have written its file
        assert {j["job_id"]: j["cluster"] for j in jobs} == written
    finally:
        for cluster, jobs in blockers.items():
            ssh_login(testbed.cluster_config, cluster, "scancel " + " ".join(jobs))
        subprocess.run(["corral", "cancel", "--all"], env=env, capture_output=True)
