"""`k8s/<context>` next to the real Slurm testbed. The Kubernetes side is a FAKE API server
(testbed/kubeapi.py: no real Kubernetes can be installed on these machines) that schedules pods by their
requests, runs Indexed Jobs' pods as local processes and reports as the API does; Corral reaches it
through the official `kubernetes` client as it would a real one. What these tests show: one view of
every kind at one round trip each; overflow to Kubernetes only where Slurm cannot start the work
sooner; Indexed Jobs with the same variables; pending reasons from the scheduler; logs, cancel, queue;
pod_config passed through; a lost node failing the attempt as the infrastructure's doing, and a managed
job recovered. `tests/infra/kube/test_real_cluster.py` runs against a real cluster when one is named."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import POOL
from tests.conftest import wait_for
from tests.helpers import counting_ssh, launch_managed


def kube_settings(kube) -> dict:
    return {"kubernetes": {"allowed_contexts": [kube.context], "kubeconfig": str(kube.kubeconfig)}}


@pytest.fixture
def kube_env(corral_env, kube, tmp_path):
    home = tmp_path / "corral-home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(json.dumps(kube_settings(kube)))
    yield corral_env
    subprocess.run(["corral", "cancel", "--all"], env=corral_env, capture_output=True)
    wait_for("the fake's pods to end", lambda: not [p for p in pods(kube) if p["status"]["phase"] == "Running"], 30)


def pods(kube, selector: str = "app.kubernetes.io/managed-by=corral") -> list[dict]:
    return kube.request("GET", f"/api/v1/namespaces/default/pods?labelSelector={selector}")["items"]


def job_of(corral, env, job_id: str) -> dict:
    return {j["job_id"]: j for j in corral("queue", "--json", env=env).json()}[job_id]


def test_one_view_of_every_kind_at_one_round_trip_each(corral, corral_env, kube, machines, testbed, tmp_path):
    config = tmp_path / "cluster-file"
    config.write_text(testbed.cluster_config.read_text() + "\n" + machines.ssh_config.read_text())
    home = tmp_path / "corral-home"
    home.mkdir(exist_ok=True)
    (home / "config.yaml").write_text(json.dumps({**POOL, **kube_settings(kube)}))
    env, calls = counting_ssh(tmp_path, {**corral_env, "CORRAL_SLURM_CONFIG": str(config)})
    for attempt in ("cold", "warm"):
        before, requests_before = len(calls()), len(kube.requests())
        gpus = corral("gpus", "--json", env=env)
        assert gpus.exit_code == 0, gpus.stderr
        assert sorted(calls()[before:]) == ["alpine", "borealis", "cirrus", "lab1", "lab2", "lab3", "lab4"], attempt
        # The context's one round trip: its nodes and its pods, asked together.
        assert sorted(kube.requests()[requests_before:]) == ["GET /api/v1/nodes", "GET /api/v1/pods"], attempt
    rows = {(r["cluster"], r["gpu"]): r for r in gpus.json() if "error" not in r}
    assert (rows[("kind-fake", "A100")]["total"], rows[("kind-fake", "A100")]["nodes"]) == (8, 2)
    assert rows[("kind-fake", "A100")]["gres_type"] == "NVIDIA-A100-SXM4-80GB"  # GPU feature discovery's label
    assert rows[("kind-fake", "L4")]["gres_type"] == "nvidia-l4"  # GKE's label
    assert ("lab", "A100") in rows and ("alpine", "H100") in rows  # side by side
    table = corral("gpus", env=env).stdout
    assert "kind-fake" in table and "lab" in table and "borealis" in table
    only = corral("gpus", "--json", "--infra", "k8s", env=env).json()
    assert {r["cluster"] for r in only} == {"kind-fake"}
    assert {r["cluster"] for r in corral("gpus", "--json", "--infra", "kubernetes/kind-fake", env=env).json()} == {
        "kind-fake"}
    checked = {c["cluster"]: c for c in corral("check", "--json", env=env).json()}
    assert checked["kind-fake"]["ok"] and checked["lab"]["ok"] and checked["alpine"]["ok"]
    assert checked["kind-fake"]["warnings"] == []  # the fake grants every RBAC right
    assert "(kubernetes)" in corral("check", env=env).stdout
    kube.forbid("secrets")  # a Role from before Corral's Secrets: check says so before a job is refused
    try:
        shown = corral("check", env=env)
    finally:
        kube.forbid("secrets", False)
    assert shown.exit_code == 0, shown.stderr
    assert ("kind-fake: your kubeconfig's user may not create, patch, delete, deletecollection secrets in namespace "
            "default: each job there is refused") in " ".join(shown.stderr.split())
    # A context whose API server does not answer: its row named as its place's would be, the cause in a
    # few words (it was the bare context, and urllib3's 300-character message)
    dead = json.loads(kube.kubeconfig.read_text())
    dead["clusters"][0]["cluster"]["server"] = "http://127.0.0.1:9"  # discard: nothing listens
    (tmp_path / "dead-kubeconfig").write_text(json.dumps(dead))
    (home / "config.yaml").write_text(json.dumps({**POOL, "kubernetes": {
        "allowed_contexts": [kube.context], "kubeconfig": str(tmp_path / "dead-kubeconfig")}}))
    silent = corral("gpus", "--infra", "k8s", env=env)
    assert silent.stdout.splitlines()[1].split()[:2] == ["k8s/kind-fake", "unavailable"], silent.stdout
    assert silent.stderr == ("✗ kind-fake: the API server at http://127.0.0.1:9 does not answer: connection "
                             "refused\n"), silent.stderr
    [failed] = corral("check", "--json", "kind-fake", env=env).json()
    assert (failed["ok"], failed["kind"]) == (False, "k8s")  # its kind, though it did not answer (it was null)
    assert corral("check", "kind-fake", env=env).stdout.splitlines()[1].split()[:4] == [
        "kind-fake", "FAIL", "(unreachable)", "(kubernetes)"]


def test_work_overflows_to_kubernetes_as_indexed_jobs(corral, kube_env, kube):
    # L4: alpine can start it now, so Slurm first (the context's L4 node is the overflow).
    l4 = corral("launch", "-d", "--json", "--gpus", "L4:1", "--", "true", env=kube_env).json()
    assert l4["cluster"] == "alpine"
    run = ('echo "rank=$CORRAL_NODE_RANK host=$(hostname) gpus=$NVIDIA_VISIBLE_DEVICES '
           'nodes=$(echo $CORRAL_NODE_IPS | tr " " ,) n=$CORRAL_NUM_NODES cluster=$CORRAL_CLUSTER id=$CORRAL_TASK_ID"; '
           "sleep 300")
    both = corral("launch", "-d", "--json", "--gpus", "A100:4", "--num-nodes", "2", "--", run, env=kube_env)
    assert both.exit_code == 0, both.stderr
    placed = both.json()
    handle, job_id = placed["slurm_job_id"], placed["job_id"]
    assert placed["cluster"] == "kind-fake" and handle.startswith("corral-")
    wait_for("both pods to run", lambda: job_of(corral, kube_env, job_id)["state"] == "RUNNING", 30)
    # Every pod's output, each line after its rank (as srun --label writes a Slurm job's log), rank 0's first
    out = wait_for("its output", lambda: (o := corral("logs", "--no-follow", job_id, env=kube_env).stdout)
                   .count("\n") == 2 and o)
    nodes = f"{handle}-0.{handle},{handle}-1.{handle}"
    assert out.splitlines() == [
        f"0: rank=0 host={handle}-0 gpus=0,1,2,3 nodes={nodes} n=2 cluster=kind-fake id={job_id}",
        f"1: rank=1 host={handle}-1 gpus=0,1,2,3 nodes={nodes} n=2 cluster=kind-fake id={job_id}"]
    assert sorted(p["spec"]["nodeName"] for p in pods(kube, f"job-name={handle}")) == ["kn1", "kn2"]
    assert job_of(corral, kube_env, job_id)["infra"] == "k8s/kind-fake"
    assert "k8s/kind-fake" in corral("queue", env=kube_env).stdout
    # Every A100 is taken: the next task waits in the context, with the scheduler's own reason.
    waiting = corral("launch", "-d", "--json", "--gpus", "A100:1", "--", "echo later", env=kube_env).json()
    assert waiting["cluster"] == "kind-fake"
    reason = wait_for("the scheduler's reason", lambda: job_of(corral, kube_env, waiting["job_id"])["reason"], 20)
    assert "0/4 nodes are available" in reason and "Insufficient nvidia.com/gpu" in reason, reason
    assert job_of(corral, kube_env, waiting["job_id"])["state"] == "PENDING"
    # Cancel ends the pods (their processes too); the waiting task gets the GPUs and runs.
    assert "cancelled" in corral("cancel", job_id, env=kube_env).stdout
    token = handle.removeprefix("corral-")
    wait_for("the pods' processes to end", lambda: subprocess.run(["pgrep", "-f", f"runs/{token}"],
                                                                  capture_output=True).returncode != 0, 20)
    wait_for("the waiting task to run and end", lambda: job_of(corral, kube_env, waiting["job_id"])["state"]
             == "SUCCEEDED", 30)
    assert corral("logs", "--no-follow", waiting["job_id"], env=kube_env).stdout == "later\n"
    assert job_of(corral, kube_env, job_id)["state"] == "CANCELLED"
    # A task's own failure: its exit code, as the task's doing.
    failed = corral("launch", "-d", "--json", "--infra", "k8s/kind-fake", "--gpus", "L4:1", "--", "exit 3",
                    env=kube_env).json()
    ended = wait_for("it to fail", lambda: (j := job_of(corral, kube_env, failed["job_id"]))["state"] == "FAILED" and j)
    assert (ended["exit_code"], ended["reason"]) == (3, "Error (exit code 3)")


def test_pod_config_mounts_shared_storage_and_the_workdir_and_env_travel(corral, kube_env, testbed, tmp_path):
    shared = testbed.paths.root / "kube-shared"  # stands for the NFS export the Slurm clusters mount
    shared.mkdir(exist_ok=True)
    (shared / "data.txt").write_text("from the shared filesystem\n")
    shared.chmod(0o755)
    (shared / "data.txt").chmod(0o644)
    workdir = tmp_path / "project"
    workdir.mkdir()
    (workdir / "train.py").write_text("print('trained')\n")
    task = tmp_path / "task.yaml"
    task.write_text(json.dumps({
        "name": "podcfg", "workdir": str(workdir), "envs": {"GREETING": "hello 'world'"},
        "resources": {"infra": "k8s/kind-fake", "accelerators": "L4:1"},
        "setup": "echo setup-ran > setup.out",
        "run": 'cat setup.out; python3 train.py; cat /shared/data.txt; echo "$GREETING $FROM_POD_CONFIG"',
        "config": {"kubernetes": {"pod_config": {"spec": {
            "containers": [{"env": [{"name": "FROM_POD_CONFIG", "value": "yes"}],
                            "volumeMounts": [{"name": "shared", "mountPath": "/shared"}]}],
            "volumes": [{"name": "shared", "hostPath": {"path": str(shared)}}]}}}},
    }))
    launched = corral("launch", "-d", "--json", str(task), env=kube_env)
    assert launched.exit_code == 0, launched.stderr
    job_id = launched.json()["job_id"]
    ended = wait_for("it to end", lambda: (j := job_of(corral, kube_env, job_id))["state"] in ("SUCCEEDED", "FAILED")
                     and j, 30)
    logs = corral("logs", "--no-follow", job_id, env=kube_env).stdout
    assert ended["state"] == "SUCCEEDED", logs
    assert logs == "setup-ran\ntrained\nfrom the shared filesystem\nhello 'world' yes\n"
    assert corral("logs", "--no-follow", "--tail", "2", job_id, env=kube_env).stdout == (  # the pod log's tailLines
        "from the shared filesystem\nhello 'world' yes\n")


def test_a_lost_node_fails_the_attempt_as_infrastructure_and_a_managed_job_recovers(corral, kube_env, kube,
                                                                                      tmp_path):
    env = {**kube_env, "CORRAL_CONTROLLER_INTERVAL": "1", "CORRAL_CONTROLLER_GRACE_SECONDS": "6"}
    job_id, managed = launch_managed(corral, env, tmp_path / "survivor.yaml", {
        "name": "survivor", "resources": {"infra": "k8s", "accelerators": "A100:4"},
        "run": 'echo "on $(hostname)"; sleep 600'})

    first = wait_for("the job to run", lambda: (j := managed())["state"] == "RUNNING" and j, 60)
    node = pods(kube, f"job-name={first['slurm_job_id']}")[0]["spec"]["nodeName"]
    kube.lose_node(node)
    try:
        moved = wait_for("the job to be recovered on another node", lambda: (j := managed())["state"] == "RUNNING"
                         and j["slurm_job_id"] not in (first["slurm_job_id"], None) and j, 90)
        again = pods(kube, f"job-name={moved['slurm_job_id']}")
        assert [p["spec"]["nodeName"] for p in again] != [node]
        events = corral("jobs", "events", job_id, "--json", env=env).json()
        assert any("node no longer exists" in (e.get("reason") or "") for e in events), events
        assert moved["recoveries"] >= 1 and moved["infra"] == "k8s/kind-fake"
        # `jobs logs` names each attempt's place as `queue` does, not as a Slurm partition
        shown = corral("jobs", "logs", job_id, "--no-follow", env=env)
        assert "== attempt 1 on k8s/kind-fake (job corral-" in shown.stderr, shown.stderr
    finally:
        kube.restore_node(node)
        corral("jobs", "cancel", job_id, env=env)


def test_the_fake_is_only_reached_through_the_kubeconfig(kube, tmp_path):
    """The backend's one way in is the kubeconfig: a wrong token is refused as a real API server does."""
    from urllib.error import HTTPError
    from urllib.request import Request, urlopen

    with pytest.raises(HTTPError) as refused:
        urlopen(Request(f"http://127.0.0.1:{kube.port}/api/v1/nodes", headers={"Authorization": "Bearer wrong"}),
                timeout=5)
    assert refused.value.code == 401
    assert json.loads(Path(kube.kubeconfig).read_text())["contexts"][0]["name"] == "kind-fake"


def test_jobs_why_says_where_a_managed_job_waits_in_kubernetes_and_why(corral, kube_env, tmp_path):
    env = {**kube_env, "CORRAL_CONTROLLER_INTERVAL": "1"}
    full = corral("launch", "-d", "--json", "--gpus", "A100:4", "--num-nodes", "2", "--", "sleep 300", env=env)
    assert full.exit_code == 0 and full.json()["cluster"] == "kind-fake", full.stderr
    job_id, managed = launch_managed(corral, env, tmp_path / "waiter.yaml", {
        "name": "waiter", "resources": {"infra": "k8s/kind-fake", "accelerators": "A100:1"}, "run": "true"})
    try:
        wait_for("it to wait with the scheduler's reason", lambda: (j := managed())["state"] == "PENDING"
                 and "nodes are available" in (j.get("reason") or ""), 30)
        why = corral("jobs", "why", job_id, env=env)
        assert why.exit_code == 0, why.stderr
        first = why.stdout.splitlines()[0]
        assert first.startswith(f"{job_id} is pending on k8s/kind-fake: FailedScheduling: 0/4 nodes are available"), first
        assert "Insufficient nvidia.com/gpu" in first
    finally:
        corral("jobs", "cancel", job_id, env=env)


def test_an_ended_jobs_secret_is_deleted_by_the_servers_pass_and_its_log_stays(corral, kube_env, kube):
    """The job's env values live in a Secret; the server's run files pass deletes it (and the
    ConfigMap) once the job ended, and says so; the Job, and so its log, stays until its TTL, with
    keep_days too (a pod's home ended with the pod)."""
    import asyncio
    import base64
    import time

    from corral import run_files
    from corral.client import Client
    from corral.state import open_store

    env = {**kube_env, "CORRAL_RUN_FILES_INTERVAL": "1", "CORRAL_RUN_FILES_GRACE": "0"}
    launched = corral("launch", "-d", "--json", "--secret", "TOKEN=s3cret-value", "--infra", "k8s/kind-fake", "--",
                      'echo "ran with ${#TOKEN} characters"', env=env)
    assert launched.exit_code == 0, launched.stderr
    job_id, handle = launched.json()["job_id"], launched.json()["slurm_job_id"]
    token = handle.removeprefix("corral-")
    secret = kube.request("GET", f"/api/v1/namespaces/default/secrets/{handle}")
    assert "s3cret-value" in base64.b64decode(secret["data"]["env.sh"]).decode()
    log = Path(env["CORRAL_HOME"]) / "controller.log"
    said = "removed env.sh from 1 ended jobs' run directories on kind-fake"
    wait_for("the server to say it deleted the Secret", lambda: said in log.read_text(), timeout=60, interval=0.5)
    for kind in ("secrets", "configmaps"):
        assert kube.request("GET", f"/api/v1/namespaces/default/{kind}?labelSelector=corral.dev/token={token}"
                            )["items"] == [], kind
    assert corral("logs", "--no-follow", job_id, env=env).stdout == "ran with 12 characters\n"
    whole = asyncio.run(run_files.remove_run_dirs(Client(), open_store(), time.time(), keep_days=0, grace=0))
    assert whole.removed == {"kind-fake": 1} and whole.errors == {}
    assert corral("logs", "--no-follow", job_id, env=env).stdout == "ran with 12 characters\n"


def test_a_dev_allocation_is_not_placed_on_kubernetes_and_the_plan_says_why(corral, kube_env):
    """Kubernetes cannot hold one yet: pinned there, `launch -c` is refused with that reason (it said
    `k8s/kind-fake: None`), and `launch -c --dryrun` shows the context as not feasible, why included."""
    refused = corral("launch", "-c", "kdev", "--infra", "k8s/kind-fake", "--gpus", "A100:1", env=kube_env)
    assert refused.exit_code == 69
    assert ("no cluster can run this task:\n  k8s/kind-fake: cannot hold a dev allocation yet (Slurm clusters and SSH "
            "pools can)") in refused.stderr, refused.stderr
    plan = corral("launch", "-c", "kdev", "--gpus", "A100:1", "--dryrun", "--json", env=kube_env).json()
    [row] = [r for r in plan if r["infra"] == "k8s/kind-fake"]
    assert (row["feasible"], row["can_start_now"]) == (False, False) and "cannot hold a dev allocation" in row["reason"]
    plain = corral("launch", "--gpus", "A100:1", "--infra", "k8s", "--dryrun", "--json", "--", "true",
                   env=kube_env).json()
    assert [r["feasible"] for r in plain] == [True]  # a job's plan is unchanged


def test_a_walltime_is_the_pods_deadline_and_its_end_is_the_tasks_doing(corral, kube_env, kube):
    launched = corral("launch", "-d", "--json", "--infra", "k8s/kind-fake", "--gpus", "L4:1", "--time", "0:02", "--",
                      "echo started; sleep 300", env=kube_env).json()
    [pod] = pods(kube, f"job-name={launched['slurm_job_id']}")
    assert pod["spec"]["activeDeadlineSeconds"] == 2
    ended = wait_for("its deadline", lambda: (j := job_of(corral, kube_env, launched["job_id"]))["state"] == "FAILED"
                     and j, timeout=30)
    assert ended["reason"].startswith("DeadlineExceeded (it reached its time limit: Pod was active on the node"), ended
    assert corral("logs", "--no-follow", launched["job_id"], env=kube_env).stdout == "started\n"
    token = launched["slurm_job_id"].removeprefix("corral-")
    wait_for("the pod's process to end", lambda: subprocess.run(["pgrep", "-f", f"runs/{token}"],
                                                                capture_output=True).returncode != 0, 20)


def test_a_job_group_is_not_placed_on_kubernetes_and_says_why(corral, kube_env, tmp_path):
    """Its tasks would wait for CORRAL_JOBGROUP_HOSTS files that no pod writes: left out, with the reason."""
    env = {**kube_env, "CORRAL_CONTROLLER_INTERVAL": "1"}
    task = "resources: {infra: k8s/kind-fake, accelerators: L4:1}\nrun: echo hi\n"
    (tmp_path / "group.yaml").write_text(f"name: kgroup\nexecution: parallel\n---\nname: a\n{task}---\nname: b\n{task}")
    launched = corral("jobs", "launch", "-d", "--json", "group.yaml", env=env, cwd=tmp_path)
    assert launched.exit_code == 0, launched.stderr
    ids = launched.json()["job_ids"]
    try:
        why = ("k8s/kind-fake: cannot run a job group's tasks yet: it gives them no CORRAL_JOBGROUP_HOSTS (Slurm "
               "clusters and SSH pools whose machines share a home can)")

        def reasons() -> list[str] | None:
            rows = {j["job_id"]: j for j in corral("jobs", "queue", "-a", "--json", env=env).json()}
            said = [rows[i]["reason"] or "" for i in ids]
            return said if all(why in r for r in said) else None
        said = wait_for("the group's reasons", reasons, timeout=30)
        assert all(r.startswith("no cluster can run every task of its job group now: ") for r in said), said
    finally:
        corral("jobs", "cancel", *ids, env=env)
