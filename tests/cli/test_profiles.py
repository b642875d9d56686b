"""Cluster profiles on the real testbed: one task file runs unchanged on three clusters whose profiles
load a different CUDA module (Debian's environment-modules; the modules are stand-ins that set
CUDA_VERSION) and name a different scratch directory; `--dryrun` shows what each would run with, at
no extra round trip; `corral check` names what a wrong profile gets wrong."""

from __future__ import annotations

import json

from tests.helpers import counting_ssh, ssh_login

TASK = """\
name: portable
resources:
  cpus: 1
run: |
  mkdir -p "$CORRAL_SCRATCH"
  echo "$CORRAL_CLUSTER cuda=$CUDA_VERSION site=$SITE" | tee "$CORRAL_SCRATCH/out-$CORRAL_TASK_ID"
"""
MODULES = {"alpine": "12.1", "borealis": "12.4", "cirrus": "12.2"}  # each site's, from its own module tree


def config(root) -> str:
    clusters = {}
    for cluster, version in MODULES.items():
        clusters[cluster] = {
            "setup_prefix": f"source /etc/profile.d/modules.sh\nmodule use {root}/{cluster}/modules\n"
                            f"module load cuda/{version}",
            "paths": {"CORRAL_SCRATCH": f"{root}/{cluster}/scratch/$USER"},
            "env": {"SITE": f"{cluster}-site"},
        }
    clusters["borealis"]["account"] = "research"  # the one cluster with accounting: Slurm records it
    clusters["alpine"]["avoid_partitions"] = ["gpu"]
    return json.dumps({"clusters": clusters})  # JSON is YAML


def test_one_task_runs_unchanged_on_three_clusters_whose_profiles_differ(corral, corral_env, testbed, clean_queues,
                                                                        tmp_path):
    root = testbed.paths.root
    (tmp_path / "corral-home").mkdir(exist_ok=True)
    (tmp_path / "corral-home" / "config.yaml").write_text(config(root))
    task = tmp_path / "portable.yaml"
    task.write_text(TASK)

    planned = corral("launch", "--dryrun", "--json", str(task))
    assert planned.exit_code == 0, planned.stderr
    rows = {r["infra"]: r for r in planned.json() if r.get("partition")}
    assert rows["slurm/alpine/gpu"]["reason"] == "avoided by the cluster's profile (avoid_partitions)"
    cpu = rows["slurm/alpine/cpu"]["runs_with"]
    assert cpu["paths"] == {"CORRAL_SCRATCH": f"{root}/alpine/scratch/$USER"} and cpu["env"] == ["SITE"]
    assert cpu["setup_prefix"].endswith("module load cuda/12.1")
    assert rows["slurm/borealis/h100-cluster"]["runs_with"]["slurm"] == {"account": "research"}
    shown = corral("launch", "--dryrun", str(task)).stdout
    assert "Runs with" in shown and "slurm/borealis/h100-cluster: --account=research" in shown

    for cluster, version in MODULES.items():
        ran = corral("launch", "--infra", f"slurm/{cluster}", str(task))  # only the place changes
        assert ran.exit_code == 0, ran.stderr
        assert ran.stdout.splitlines()[-1] == f"{cluster} cuda={version} site={cluster}-site"
    jobs = {j["cluster"]: j for j in corral("queue", "--json", "--all").json()}
    for cluster, job in jobs.items():  # each wrote into its own cluster's scratch
        assert [p.parent.parent.parent.name for p in root.glob(f"*/scratch/corral-test/out-{job['job_id']}")] == \
            [cluster]
    borealis_job = jobs["borealis"]
    account = ssh_login(testbed.cluster_config, "borealis",
                        f"sacct -n -X -P -j {borealis_job['slurm_job_id']} -o account").strip()
    assert account == "research"

    # A profile is read in the server, not asked of the clusters: a dry run costs the same round trips.
    env, calls = counting_ssh(tmp_path, corral_env)
    corral("server", "stop", env=env)
    corral("launch", "--dryrun", str(task), env=env)
    with_profiles = len(calls())
    (tmp_path / "corral-home" / "config.yaml").write_text("{}\n")
    corral("server", "stop", env=env)
    corral("launch", "--dryrun", str(task), env=env)
    assert len(calls()) - with_profiles == with_profiles


def test_check_names_what_a_profile_gets_wrong(corral, tmp_path):
    (tmp_path / "corral-home").mkdir(exist_ok=True)
    (tmp_path / "corral-home" / "config.yaml").write_text(
        "clusters:\n  borealis: {account: nosuch, qos: normal, partitions: {gpu: {qos: normal}}}\n"
        "  cirrus: {account: research}\n")
    checked = corral("check")
    assert checked.exit_code == 0, checked.stderr  # the clusters answer: warnings, not failures
    warned = [line for line in checked.stderr.splitlines() if line.startswith("corral: warning: ")]
    assert warned == [
        "corral: warning: borealis: the profile names partition 'gpu', which borealis does not have "
        "(partitions: h100-cluster, l40s)",
        "corral: warning: borealis: the profile names account 'nosuch', which your user has no association with "
        "on borealis (yours: research)",
        "corral: warning: cirrus: could not check the profile's account research: cirrus did not list your "
        "associations (no accounting there, or sacctmgr failed)"], checked.stderr
    assert [c["warnings"] for c in corral("check", "alpine", "--json").json()] == [[]]
    (tmp_path / "corral-home" / "config.yaml").write_text("clusters:\n  alpne: {account: a}\n")
    corral("server", "stop")
    broken = corral("check")
    assert broken.exit_code == 78 and "clusters.alpne: no such cluster in the cluster file" in broken.stderr
