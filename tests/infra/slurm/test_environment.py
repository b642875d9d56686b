"""What a user's login environment may set for Slurm, unset before Corral's scripts: through a real bash,
and in the submissions (a job's own account or QOS beats the user's SBATCH_ACCOUNT, SBATCH_QOS)."""

from __future__ import annotations

import shutil
import subprocess

import pytest

from corral.infra.shell import one_line_word
from corral.infra.slurm.environment import PRELUDE, login_shell_line, unset_named
from corral.infra.slurm.jobscript import submit_script
from tests.infra.slurm.test_jobscript import spec
from tests.infra.slurm.test_userscript import request

HABITS = {"SLURM_TIME_FORMAT": "relative", "SLURM_CLUSTERS": "other", "SQUEUE_FORMAT": "%i", "SQUEUE_USERS": "x",
              "SINFO_PARTITION": "p", "SACCT_FORMAT": "JobID", "SCONTROL_FEDERATION": "1", "SCANCEL_INTERACTIVE": "1",
              "SBATCH_PARTITION": "p", "SBATCH_OUTPUT": "/elsewhere", "SBATCH_EXPORT": "NONE", "SBATCH_ACCOUNT": "mine",
              "SBATCH_QOS": "mine", "SBATCH_RESERVATION": "mine", "SBATCH_WCKEY": "mine",
              "SLURM_CONF": "/etc/slurm/slurm.conf", "SQUEUE": "not a Slurm variable"}
KEPT = {"SBATCH_ACCOUNT": "mine", "SBATCH_QOS": "mine", "SBATCH_RESERVATION": "mine", "SBATCH_WCKEY": "mine",
        "SLURM_CONF": "/etc/slurm/slurm.conf", "SQUEUE": "not a Slurm variable"}


def environment(env0: str) -> dict[str, str]:
    return dict(entry.split("=", 1) for entry in env0.split("\0") if "=" in entry)


def test_the_prelude_unsets_what_changes_slurms_output_or_target_and_keeps_accounting_defaults():
    shown = subprocess.run(["bash", "--noprofile", "--norc", "-c", PRELUDE + "env -0"], capture_output=True,
                           text=True, check=True, env={"PATH": "/usr/bin:/bin", **HABITS}).stdout
    left = environment(shown)
    assert {k: v for k, v in left.items() if k in HABITS} == KEPT
    assert "corral_v" not in left


# What ssh hands a user's login shell (`corral ssh`, the dev alias's ProxyCommand): csh-family shells
# take `!` as history even between single quotes, and cannot quote a newline.
@pytest.mark.parametrize("login_shell", ["bash", "dash", "zsh", "tcsh"])
def test_a_command_line_for_any_login_shell_runs_in_a_login_bash_with_the_prelude(login_shell, tmp_path):
    (tmp_path / ".bash_profile").write_text("echo the profile says hi\nexport FROM_PROFILE=yes\n")
    command = "echo \"it's done!\"\nprintf '%s|' \\\\back \"tab\there\" \"$FROM_PROFILE\"; env -0 > env.out"
    line = login_shell_line(f"cd {one_line_word(str(tmp_path))} && exec bash -c {one_line_word(command)}")
    ran = subprocess.run([shutil.which(login_shell) or login_shell, "-c", line], capture_output=True, text=True,
                         check=False, env={"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), **HABITS}, timeout=30)
    assert ran.returncode == 0, ran.stderr
    assert ran.stdout == "it's done!\n\\back|tab\there|yes|"  # the profile's words went to stderr
    assert ran.stderr == "the profile says hi\n"
    left = environment((tmp_path / "env.out").read_text())
    assert {k: v for k, v in left.items() if k in HABITS} == KEPT and "corral_v" not in left


@pytest.mark.parametrize("script", ["echo a\necho b", "echo !x", "history !!"])
def test_a_script_a_csh_would_mangle_is_refused(script):
    with pytest.raises(ValueError):
        login_shell_line(script)


def test_a_job_that_names_its_account_or_qos_is_submitted_without_the_users_default_for_it():
    assert unset_named(["partition", "account", "qos", "account"]) == "unset SBATCH_ACCOUNT SBATCH_QOS; "
    assert unset_named(["partition", "time"]) == ""
    assert "unset SBATCH_ACCOUNT SBATCH_QOS; sbatch --parsable job.sbatch" in submit_script(spec())
    bare = submit_script(spec(account=None, qos=None, sbatch_args=("-A", "lab", "--reservation=r1")))
    assert "unset SBATCH_ACCOUNT SBATCH_RESERVATION; sbatch --parsable job.sbatch" in bare
    assert "unset SBATCH" not in submit_script(spec(account=None, qos=None, sbatch_args=()))
    from corral.infra.slurm.userscript import submit_script as submit_user_script

    named = submit_user_script(request("het_mem_per_cpu", "h100-cluster", None, "research", "normal"), "borealis")
    assert 'unset SBATCH_ACCOUNT SBATCH_QOS; cd "$d/workdir" || exit 1; exec' in named
    assert "unset SBATCH" not in submit_user_script(request("array", "cpu", None), "alpine")
