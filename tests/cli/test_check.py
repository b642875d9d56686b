"""`corral check` against the real testbed."""

from __future__ import annotations

import pytest


def by_cluster(rows):
    return {r["cluster"]: r for r in rows}


def test_all_clusters_answer(corral, testbed):
    result = corral("check", "--json")
    assert result.exit_code == 0, result.stderr
    rows = by_cluster(result.json())
    assert list(rows) == [s.name for s in testbed.clusters]
    for spec in testbed.clusters:
        row = rows[spec.name]
        assert row["ok"] is True and row["error"] is None
        assert row["slurm_version"] == "22.05.8"
        assert row["partitions"] == [p.name for p in spec.partitions]
        assert row["gpu_types"] == sorted(spec.gpu_types)
    assert rows["borealis"]["default_partition"] == "h100-cluster"


def test_table_and_named_clusters(corral):
    result = corral("check", "cirrus", "alpine")
    assert result.exit_code == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].split()[:3] == ["CLUSTER", "STATUS", "SLURM"]
    assert [line.split()[0] for line in lines[1:] if line.strip() and not line.startswith(" " * 10)] == ["cirrus", "alpine"]
    assert "b300*, debug, maint" in result.stdout


def test_allowed_clusters_leaves_the_other_hosts_out(corral, corral_env):
    """SkyPilot's `slurm: allowed_clusters`: the other Host entries (a bastion) are asked nothing."""
    from pathlib import Path

    home = Path(corral_env["CORRAL_HOME"])
    home.mkdir(parents=True, exist_ok=True)
    (home / "config.yaml").write_text("slurm:\n  allowed_clusters: [cirrus, borealis]\n")
    result = corral("check", "--json")
    assert result.exit_code == 0, result.stderr
    assert list(by_cluster(result.json())) == ["borealis", "cirrus"]  # the cluster file's order
    unknown = corral("check", "alpine")
    assert unknown.exit_code != 0 and "alpine" in unknown.stderr


def test_unknown_cluster_lists_known_ones(corral):
    result = corral("check", "nowhere")
    assert result.exit_code == 66
    assert result.stderr.strip() == (
        "corral: error: unknown cluster 'nowhere'; known clusters: alpine, borealis, cirrus"
    )


@pytest.fixture
def login_stopped(testbed):
    testbed.stop_login("alpine")
    yield "alpine"
    testbed.start_login("alpine")


def test_stopped_controller_is_reported_and_others_answer(corral, controller_stopped):
    result = corral("check", "--json")
    assert result.exit_code == 1
    rows = by_cluster(result.json())
    assert rows["cirrus"]["ok"] is False and rows["cirrus"]["error_kind"] == "controller"
    # Reported from `scontrol ping`'s refusal, not after waiting out a timeout.
    assert rows["cirrus"]["error"] == "cirrus: Slurm controller is down: Slurmctld(primary) at cirrus-ctl is DOWN"
    assert rows["alpine"]["ok"] and rows["borealis"]["ok"]
    human = corral("check")
    assert human.exit_code == 1, human.stderr
    assert "cirrus: Slurm controller is down" in human.stderr, human.stderr  # says why, if it ever differs


def test_stopped_login_node_is_reported_and_others_answer(corral, login_stopped):
    result = corral("check", "--json")
    assert result.exit_code == 1
    rows = by_cluster(result.json())
    assert rows["alpine"]["ok"] is False and rows["alpine"]["error_kind"] == "unreachable"
    assert rows["alpine"]["error"] == "alpine: login node refused the connection (is sshd running?)"
    assert rows["borealis"]["ok"] and rows["cirrus"]["ok"]


def test_login_node_dying_under_a_live_control_master(corral, testbed):
    assert corral("check", "alpine").exit_code == 0  # leaves a ControlMaster behind
    testbed.stop_login("alpine")
    try:
        result = corral("check", "alpine", "--json")
        assert result.json()[0]["error_kind"] == "unreachable"
    finally:
        testbed.start_login("alpine")
    assert corral("check", "alpine").exit_code == 0  # and recovers without manual cleanup


def test_missing_cluster_file(corral, corral_env, tmp_path):
    env = {**corral_env, "CORRAL_SLURM_CONFIG": str(tmp_path / "missing")}
    result = corral("check", env=env)
    assert result.exit_code == 78
    assert result.stderr.startswith(f"corral: error: {tmp_path / 'missing'}: cluster file not found")


def test_malformed_cluster_file(corral, corral_env, tmp_path):
    path = tmp_path / "config"
    path.write_text("Host a\n    HostName\n")
    result = corral("gpus", env={**corral_env, "CORRAL_SLURM_CONFIG": str(path)})
    assert result.exit_code == 78
    assert result.stderr.strip() == (
        f"corral: error: {path}:2: malformed line 'HostName': expected `Keyword value` (OpenSSH config syntax)"
    )
