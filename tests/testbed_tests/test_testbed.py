"""The testbed itself: real daemons, idempotent bring-up, fault switches."""

from __future__ import annotations

import subprocess
import uuid

from testbed.processes import read_pid
from tests.conftest import wait_for
from tests.helpers import as_member as as_user, ssh_login


def daemon_pids(testbed):
    paths = {spec.name: testbed.paths.cluster(spec.name) for spec in testbed.clusters}
    return {
        name: [read_pid(p.ctld_pidfile()), read_pid(p.sshd_pidfile()), read_pid(p.run / "munged.pid")]
        for name, p in paths.items()
    }


def test_up_is_idempotent(testbed):
    before = daemon_pids(testbed)
    testbed.up(install_user_config=False)
    assert daemon_pids(testbed) == before


def test_clusters_are_independent(testbed):
    ports = [s.ctld_port for s in testbed.clusters] + [s.ssh_port for s in testbed.clusters]
    assert len(set(ports)) == len(ports)
    sockets = {testbed.paths.cluster(s.name).munge_socket for s in testbed.clusters}
    assert len(sockets) == 3 and all(s.is_socket() for s in sockets)
    # A job on one cluster is invisible to the others.
    config = testbed.cluster_config
    name = f"indep-{uuid.uuid4().hex[:8]}"
    ssh_login(config, "alpine", f"sbatch -o /dev/null --hold -J {name} --wrap true")
    try:
        assert ssh_login(config, "alpine", f"squeue -h -n {name} -o %j").strip() == name
        assert ssh_login(config, "borealis", f"squeue -h -n {name} -o %j").strip() == ""
        assert ssh_login(config, "borealis", "scontrol show config | grep ^ClusterName").split()[-1] == "borealis"
    finally:
        ssh_login(config, "alpine", f"scancel -n {name}")


def test_job_runs_on_a_named_node_with_fake_gpus(testbed):
    out = ssh_login(testbed.cluster_config, "borealis",
                    "srun -p l40s -w b3 --gres=gpu:l40s:2 bash -c 'echo $(hostname) $CUDA_VISIBLE_DEVICES'")
    assert out.split() == ["b3", "0,1"]


def test_kill_and_restart_a_node_daemon(testbed):
    pidfile = testbed.paths.cluster("cirrus").slurmd_pidfile("c3")
    old = read_pid(pidfile)
    testbed.kill_node("c3")
    assert testbed.status()["cirrus"]["slurmd:c3"] is False
    testbed.start_node("c3")
    assert testbed.status()["cirrus"]["slurmd:c3"] is True and read_pid(pidfile) != old
    wait_for("c3 to take jobs again", lambda: ssh_login(
        testbed.cluster_config, "cirrus", "srun -p debug -w c3 -t 1 hostname").strip() == "c3", timeout=60)


def test_drain_and_resume(testbed):
    testbed.drain("a4", reason="testing drain")
    try:
        assert testbed.node_states("alpine")["a4"] == "drain"
    finally:
        testbed.resume("a4")
    assert testbed.node_states("alpine")["a4"] == "idle"


def test_one_cluster_has_accounting_and_one_has_not(testbed):
    config = testbed.cluster_config
    job = ssh_login(config, "borealis", "sbatch -o /dev/null --parsable --gres=gpu:H100:2 --wrap true").strip()

    def accounted() -> str:
        return ssh_login(config, "borealis", f"sacct -n -X -P -j {job} -o State,AllocTRES").strip()

    record = wait_for("sacct to record the job", lambda: accounted().startswith("COMPLETED") and accounted())
    assert "gres/gpu=2" in record and "gres/gpu:h100=2" in record
    alpine = subprocess.run(["ssh", "-F", str(config), "alpine", "sacct"], capture_output=True, text=True)
    assert "accounting storage is disabled" in alpine.stdout + alpine.stderr


def test_daemons_do_not_hold_a_working_directory(testbed):
    """Job steps inherit slurmd's cwd: a deleted one would print errors into every job's output."""
    import os

    pids = [read_pid(testbed.paths.cluster(s.name).slurmd_pidfile(n.name)) for s in testbed.clusters for n in s.nodes]
    assert pids and all(os.readlink(f"/proc/{pid}/cwd") == "/" for pid in pids)


def test_team_members_are_their_own_accounts_on_every_cluster(testbed):
    """Each member's key opens their account only; their jobs and files are theirs in Slurm, in sacct
    and on disk; one member can neither read the other's files nor cancel the other's job."""
    from testbed.spec import TEAM_USERS

    alice, bob = TEAM_USERS[:2]
    for spec in testbed.clusters:
        assert as_user(testbed, alice, spec.name, "id -un").stdout.strip() == alice
    wrong = subprocess.run(["ssh", "-F", str(testbed.cluster_config), "-l", bob, "-i",
                            str(testbed.paths.user_key(alice)), "-o", "BatchMode=yes", "-o", "IdentitiesOnly=yes",
                            "-o", "IdentityFile=none", "alpine", "true"], capture_output=True, text=True, timeout=60)
    assert wrong.returncode == 255 and "Permission denied" in wrong.stderr  # alice's key is not bob's

    name = f"team-{uuid.uuid4().hex[:8]}"
    submitted = as_user(testbed, alice, "borealis",
                        f"mkdir -p ~/{name} && cd ~/{name} && sbatch --parsable -J {name} -t 5 "
                        f"--wrap 'echo mine > out; sleep 300'")
    assert submitted.returncode == 0, submitted.stderr
    job = submitted.stdout.strip()
    try:
        assert as_user(testbed, bob, "borealis", f"squeue -h -j {job} -o %u").stdout.strip() == alice
        wait_for("the job to write its file", lambda: as_user(
            testbed, alice, "borealis", f"stat -c %U ~/{name}/out").stdout.strip() == alice, timeout=60)
        peek = as_user(testbed, bob, "borealis", f"cat ~{alice}/{name}/out")
        assert peek.returncode != 0 and "Permission denied" in peek.stderr
        refused = as_user(testbed, bob, "borealis", f"scancel {job}")
        assert "Access/permission denied" in refused.stderr, refused.stderr
        assert as_user(testbed, alice, "borealis", f"squeue -h -j {job} -o %T").stdout.strip() == "RUNNING"
        record = wait_for("sacct to name her", lambda: as_user(
            testbed, alice, "borealis", f"sacct -n -X -P -j {job} -o User").stdout.strip(), timeout=60)
        assert record == alice
    finally:
        as_user(testbed, alice, "borealis", f"scancel {job}; rm -rf ~/{name}")
