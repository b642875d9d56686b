"""`corral gpus` against the real testbed."""

from __future__ import annotations

import pytest

from tests.conftest import wait_for
from tests.helpers import counting_ssh, job_state, ssh_login

ROW_KEYS = {"cluster", "partition", "gpu", "gres_type", "total", "free", "nodes", "pending"}


def rows_by_place(rows):
    return {(r["cluster"], r["partition"], r["gres_type"]): r for r in rows if "error" not in r}


def expected_totals(testbed):
    totals = {}
    for spec in testbed.clusters:
        for part in spec.partitions:
            for name in part.nodes:
                node = spec.node(name)
                if node.gpus:
                    key = (spec.name, part.name, node.gpu_type)
                    totals[key] = totals.get(key, 0) + node.gpus
    return totals


def test_every_gpu_of_every_cluster(corral, testbed):
    result = corral("gpus", "--json")
    assert result.exit_code == 0, result.stderr
    rows = result.json()
    assert all(ROW_KEYS <= set(r) for r in rows)
    places = rows_by_place(rows)
    assert {k: r["total"] for k, r in places.items()} == expected_totals(testbed)
    assert places[("alpine", "gpu", "nvidia_h100_80gb_hbm3")]["gpu"] == "H100"
    assert places[("cirrus", "debug", None)]["gpu"] == "gpu"
    assert places[("borealis", "h100-cluster", "H100")]["nodes"] == 2


def test_tolerant_filter(corral):
    h100 = corral("gpus", "h100", "--json").json()
    assert sorted((r["cluster"], r["gres_type"]) for r in h100) == [
        ("alpine", "nvidia_h100_80gb_hbm3"), ("borealis", "H100")]
    l4 = corral("gpus", "L4", "--json").json()
    assert [(r["cluster"], r["partition"]) for r in l4] == [("alpine", "inference")]  # not l40s
    none = corral("gpus", "MI300X")
    assert none.exit_code == 0 and "No GPUs matching 'MI300X'" in none.stdout


def test_infra_filter(corral):
    rows = corral("gpus", "--infra", "slurm/borealis/l40s", "--json").json()
    assert [(r["cluster"], r["partition"]) for r in rows] == [("borealis", "l40s")]
    bad = corral("gpus", "--infra", "slurm/borealis/nope")
    assert bad.exit_code == 66
    assert "borealis: no partition 'nope'; partitions: h100-cluster, l40s" in bad.stderr
    unknown = corral("gpus", "--infra", "slurm/atlantis")
    assert "unknown cluster 'atlantis'; known clusters: alpine, borealis, cirrus" in unknown.stderr


def test_human_table(corral):
    result = corral("gpus")
    assert result.exit_code == 0
    header, *lines = [line for line in result.stdout.splitlines() if line.strip()]
    assert header.split() == ["CLUSTER", "PARTITION", "GPU", "GRES", "TYPE", "FREE", "TOTAL", "NODES", "PENDING"]
    assert any(line.split()[:4] == ["alpine", "gpu", "H100", "nvidia_h100_80gb_hbm3"] for line in lines)


@pytest.fixture
def drained_a2(testbed):
    testbed.drain("a2")
    yield "a2"
    testbed.resume("a2")


def test_drained_node_gpus_are_not_free(corral, drained_a2):
    row = rows_by_place(corral("gpus", "--json").json())[("alpine", "gpu", "nvidia_h100_80gb_hbm3")]
    assert (row["total"], row["free"], row["nodes"]) == (8, 4, 2)


def test_gpus_of_a_running_job_are_not_free(corral, testbed):
    config = testbed.cluster_config
    job = ssh_login(config, "borealis", "sbatch -o /dev/null --parsable -w b1 --gres=gpu:H100:3 --wrap 'sleep 300'").strip()
    try:
        wait_for("the job to run", lambda: job_state(config, "borealis", job) == "RUNNING")
        place = ("borealis", "h100-cluster", "H100")
        row = rows_by_place(corral("gpus", "--json").json())[place]
        assert (row["total"], row["free"]) == (16, 13)
        # A second job that cannot fit waits, and shows up as pending demand.
        waiting = ssh_login(config, "borealis",
                            "sbatch -o /dev/null --parsable -N2 --gres=gpu:H100:8 --wrap 'sleep 1'").strip()
        wait_for("the big job to be pending", lambda: job_state(config, "borealis", waiting) == "PENDING")
        row = rows_by_place(corral("gpus", "--json").json())[place]
        assert row["pending"] == 16
    finally:
        ssh_login(config, "borealis", "scancel -u corral-test")


def test_unreachable_cluster_row_does_not_hide_the_others(corral, controller_stopped):
    result = corral("gpus", "--json")
    assert result.exit_code == 0
    rows = result.json()
    errors = [r for r in rows if "error" in r]
    assert errors == [{"cluster": "cirrus", "infra": "slurm/cirrus", "error": "cirrus: Slurm controller is down: "
                       "Slurmctld(primary) at cirrus-ctl is DOWN", "error_kind": "controller"}]
    assert {r["cluster"] for r in rows if "error" not in r} == {"alpine", "borealis"}


def test_one_ssh_round_trip_per_cluster(corral, corral_env, tmp_path):
    """Count real ssh processes through a PATH shim: `corral gpus` starts exactly one per cluster."""
    env, calls = counting_ssh(tmp_path, corral_env)
    for attempt in ("cold", "warm"):  # without, then with, ControlMasters already up
        before = len(calls())
        result = corral("gpus", "--json", env=env)
        assert result.exit_code == 0, result.stderr
        assert sorted(calls()[before:]) == ["alpine", "borealis", "cirrus"], attempt


def test_max_age_answers_from_the_servers_latest_probes_and_says_how_old(corral, corral_env, tmp_path):
    """`--max-age`: the server's latest probe of each cluster answers while it is young enough, with no
    round trip; the table says how old it is; without it every call probes."""
    env, calls = counting_ssh(tmp_path, corral_env)
    fresh = corral("gpus", "--json", env=env)
    assert fresh.exit_code == 0, fresh.stderr
    before = len(calls())
    shared = corral("gpus", "--json", "--max-age", "600", env=env)
    assert shared.exit_code == 0 and shared.json() == fresh.json()
    table = wait_for("the table to say its probes' age",
                     lambda: (t := corral("gpus", "--max-age", "600", env=env)).stderr and "as of" in t.stderr and t)
    assert "--max-age; 0 probes now" in table.stderr and "alpine" in table.stdout
    assert calls()[before:] == []  # no cluster asked again
    assert sorted(corral("gpus", "--json", env=env) and calls()[before:]) == ["alpine", "borealis", "cirrus"]
