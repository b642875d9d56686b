"""What a user's login environment may set for Slurm, unset before Corral's scripts: through a real bash,
and in the submissions (a job's own account or QOS beats the user's SBATCH_ACCOUNT, SBATCH_QOS)."""

from __future__ import annotations

import subprocess

from corral.infra.slurm.environment import PRELUDE, unset_named
from corral.infra.slurm.jobscript import submit_script
from tests.infra.slurm.test_jobscript import spec
from tests.infra.slurm.test_userscript import request


def test_the_prelude_unsets_what_changes_slurms_output_or_target_and_keeps_accounting_defaults():
    habits = {"SLURM_TIME_FORMAT": "relative", "SLURM_CLUSTERS": "other", "SQUEUE_FORMAT": "%i", "SQUEUE_USERS": "x",
              "SINFO_PARTITION": "p", "SACCT_FORMAT": "JobID", "SCONTROL_FEDERATION": "1", "SCANCEL_INTERACTIVE": "1",
              "SBATCH_PARTITION": "p", "SBATCH_OUTPUT": "/elsewhere", "SBATCH_EXPORT": "NONE", "SBATCH_ACCOUNT": "mine",
              "SBATCH_QOS": "mine", "SBATCH_RESERVATION": "mine", "SBATCH_WCKEY": "mine",
              "SLURM_CONF": "/etc/slurm/slurm.conf", "SQUEUE": "not a Slurm variable"}
    shown = subprocess.run(["bash", "--noprofile", "--norc", "-c", PRELUDE + "env -0"], capture_output=True,
                           text=True, check=True, env={"PATH": "/usr/bin:/bin", **habits}).stdout
    left = dict(entry.split("=", 1) for entry in shown.split("\0") if "=" in entry)
    assert {k: v for k, v in left.items() if k in habits} == {
        "SBATCH_ACCOUNT": "mine", "SBATCH_QOS": "mine", "SBATCH_RESERVATION": "mine", "SBATCH_WCKEY": "mine",
        "SLURM_CONF": "/etc/slurm/slurm.conf", "SQUEUE": "not a Slurm variable"}
    assert "corral_v" not in left


def test_a_job_that_names_its_account_or_qos_is_submitted_without_the_users_default_for_it():
    assert unset_named(["partition", "account", "qos", "account"]) == "unset SBATCH_ACCOUNT SBATCH_QOS; "
    assert unset_named(["partition", "time"]) == ""
    assert "unset SBATCH_ACCOUNT SBATCH_QOS; sbatch --parsable job.sbatch" in submit_script(spec())
    bare = submit_script(spec(account=None, qos=None, sbatch_args=("-A", "lab", "--reservation=r1")))
    assert "unset SBATCH_ACCOUNT SBATCH_RESERVATION; sbatch --parsable job.sbatch" in bare
    assert "unset SBATCH" not in submit_script(spec(account=None, qos=None, sbatch_args=()))
    from corral.infra.slurm.userscript import submit_script as submit_user_script

    named = submit_user_script(request("het_mem_per_cpu", "h100-cluster", None, "research", "normal"), "borealis")
    assert "unset SBATCH_ACCOUNT SBATCH_QOS; exec" in named
    assert "unset SBATCH" not in submit_user_script(request("array", "cpu", None), "alpine")
