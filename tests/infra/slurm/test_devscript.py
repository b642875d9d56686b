"""What a dev allocation sends to Slurm (golden file) and how its status is read."""

import shlex

import pytest

from corral.infra.slurm.devscript import (
    cancel_exec_script,
    exec_output_script,
    exec_script,
    holder_sbatch,
    parse_allocation_status,
    setup_output_script,
    session_proxy_command,
    session_proxy_script,
    shell_command,
    status_script,
)
from tests.infra.slurm.test_jobscript import check_golden, spec


def test_holder_script():
    check_golden("dev-holder.sbatch", holder_sbatch(spec(task_ids=("dev",), sbatch_args=(), time="4:00:00"), 3600))


def test_session_proxy_script():
    check_golden("dev-session-proxy.sh", session_proxy_script("dev", "alpine", ["HF_TOKEN", "WANDB_PROJECT"]))


def test_exec_script():
    """A step named for the exec, its stdout and stderr teed into the exec's folder, `ended` however it ends."""
    check_golden("dev-exec.sh", exec_script(".corral/runs/dev-1", "42", "c-0123abcd", 2, 4, "alpine",
                                            {"WORD": "it's"}, "python train.py"))


def test_exec_script_with_setup():
    """Setup first on every node of the allocation, as a step of the same name; run on the first N only if
    setup succeeded on every node, appending to the same output."""
    check_golden("dev-exec-setup.sh", exec_script(".corral/runs/dev-1", "42", "c-0123abcd", 1, 4, "alpine",
                                                  {}, "python train.py", setup="pip install -r requirements.txt"))


def test_exec_script_taking_gpus():
    """An exec naming GPUs takes that many of the allocation's slots first (waiting for them, checking
    its cancel marker and the holder meanwhile), and its steps append to the line that says it waited."""
    check_golden("dev-exec-gpus.sh", exec_script(".corral/runs/dev-1", "42", "c-0123abcd", 1, 4, "alpine",
                                                 {}, "python train.py", setup="make", gpus_claimed=1))


def test_cancelling_an_exec_scancels_its_named_step_only():
    assert cancel_exec_script(".corral/runs/dev-1", "42", "c-0123abcd") == (
        '[ -d "$HOME"/.corral/runs/dev-1 ] && mkdir -p "$HOME"/.corral/runs/dev-1/exec/c-0123abcd && '
        ': > "$HOME"/.corral/runs/dev-1/exec/c-0123abcd/cancelled\n'
        "squeue -h -s -j 42 -o '%i|%j' 2>/dev/null | awk -F'|' '$2 == \"corral-exec-c-0123abcd\" {print $1}' "
        "| xargs -r scancel\nexit 0\n")


def test_exec_ids_and_job_ids_are_checked_before_they_reach_bash():
    for job_id, exec_id in (("42;rm", "c-1"), ("42", "../c"), ("42", "c-1 x"), ("42", "")):
        for make in (lambda: exec_script(".corral/runs/x", job_id, exec_id, 1, 0, "a", {}, "true"),
                     lambda: exec_output_script(".corral/runs/x", job_id, exec_id, True),
                     lambda: cancel_exec_script(".corral/runs/x", job_id, exec_id)):
            with pytest.raises(ValueError):
                make()


def inner_script(line: str) -> str:
    """The script of a login_shell_line: what the login bash runs after the prelude."""
    words = shlex.split(line)
    assert words[:2] == ["bash", "-c"] and len(words) == 4, line
    return words[3].split("unset corral_v; ", 1)[1]


def test_session_proxy_command_is_validated_and_quoted():
    command = session_proxy_command("dev", "42", "b1", ".corral/runs/a b")  # run by bash, whatever the login shell
    assert inner_script(command) == (
        'if [ "$(squeue -h -j 42 -o %T 2>/dev/null)" != RUNNING ]; then echo \'corral: dev allocation dev (Slurm job '
        "42) is not running; see `corral status dev`' >&2; exit 1; fi; "
        "exec srun -u --jobid=42 --overlap --nodes=1 --ntasks=1 -w b1 bash \"$HOME\"/'.corral/runs/a b'/sshd/proxy.sh")
    for job_id, node in (("42;rm", "b1"), ("42", "b1;rm")):
        with pytest.raises(ValueError):
            session_proxy_command("dev", job_id, node, ".corral/runs/x")


def test_shell_command_is_validated_and_quoted():
    in_image = ('d="$HOME"/\'.corral/runs/a b\'; inside=(); if [ -f "$d/container.sh" ]; then '
                'export CORRAL_RUN_DIR="$d"; inside=(bash "$d/container.sh"); fi; ')
    assert inner_script(shell_command("42", "b1", ".corral/runs/a b", None)) == (
        in_image + 'exec srun --jobid=42 --overlap --nodes=1 --ntasks=1 -w b1 --pty "${inside[@]}" bash -l')
    assert inner_script(shell_command("42", "b1", "r", "echo 'x' $(y)!\n")).endswith(
        '"${inside[@]}" bash -lc $\'echo \\\'x\\\' $(y)\\x21\\n\'')
    for job_id, node in (("42;rm", "b1"), ("42", "b1;rm"), ("42", "$(x)")):
        with pytest.raises(ValueError):
            shell_command(job_id, node, "r", None)


def answer(squeue: str, files: str) -> str:
    return (f"@@corral clock 0\n1796015347\n2026-11-30T05:29:07\n\n@@corral squeue 0\n{squeue}\n"
            f"@@corral files-7 0\n{files}\n")


def test_a_pending_allocation_has_slurms_expected_start_in_epoch_seconds():
    """squeue's StartTime is the cluster's local time: the clock read in the same round trip maps it."""
    pending = parse_allocation_status("7", answer("7|PENDING|Resources|1:00:00|2026-11-30T06:29:07|", ""))
    assert pending.expected_start == 1796015347 + 3600
    unknown = parse_allocation_status("7", answer("7|PENDING|Priority|1:00:00|N/A|", ""))
    assert (unknown.reason, unknown.expected_start) == ("Priority", None)
    running = parse_allocation_status("7", answer("7|RUNNING|None|59:10|2026-11-30T05:27:13|a1", "ready="))
    assert running.expected_start is None


@pytest.mark.parametrize(("squeue", "files", "expected"), [
    ("7|RUNNING|None|59:10|2026-11-30T05:27:13|a[1-2]", "ready=\nlast_active=1796015300\nnodes=a1,a2",
     ("READY", None, ["a1", "a2"])),
    ("7|RUNNING|None|59:10|2026-11-30T05:27:13|a[1-2]", "", ("STARTING", "running setup", [])),
    ("7|PENDING|Resources|1:00:00|N/A|", "", ("PENDING", "Resources", [])),
    ("7|TIMEOUT|TimeLimit|0:00|2026-11-30T05:27:13|c3", "ready=\nnodes=c3", ("ENDED", "walltime ended", ["c3"])),
    ("7|NODE_FAIL|NodeDown|0:00|2026-11-30T05:27:13|a4", "ready=\nnodes=a4", ("FAILED", "a node failed", ["a4"])),
    ("7|COMPLETED|None|0:00|2026-11-30T05:27:13|a4", "ended=idle\nnodes=a4",
     ("ENDED", "released after being idle", ["a4"])),
    ("7|FAILED|NonZeroExitCode|0:00|2026-11-30T05:27:13|a4", "setup_failed=3",
     ("FAILED", "setup failed with exit code 3", [])),
    ("8|RUNNING|None|1:00|2026-11-30T05:27:13|a1", "", ("ENDED", "Slurm no longer knows the job", [])),
])
def test_status(squeue, files, expected):
    status = parse_allocation_status("7", answer(squeue, files))
    assert (status.phase.value, status.reason, status.nodes) == expected


def test_setup_output_script():
    """The holder's log from its start until ready, setup_failed, or the holder gone (squeue every 5 s)."""
    check_golden("dev-setup-output.sh", setup_output_script(".corral/runs/dev-1", "42"))
    with pytest.raises(ValueError):
        setup_output_script(".corral/runs/dev-1", "42;rm")


def test_a_failed_setup_says_its_last_lines():
    failed = "7|FAILED|NonZeroExitCode|0:00|2026-11-30T05:27:13|a4"
    said = "installing\npip: no such package\nsrun: error: a4: task 0: Exited with exit code 3\ncorral: setup failed (3)"
    status = parse_allocation_status("7", answer(failed, "setup_failed=3") + f"\n@@corral setup-7 0\n{said}\n")
    assert status.setup_output == "installing\npip: no such package\nsrun: error: a4: task 0: Exited with exit code 3"
    assert "if [ -e \"$HOME\"/.corral/runs/dev-1/setup_failed ]; then" in status_script([("7", ".corral/runs/dev-1")])


def test_status_says_whether_the_head_node_has_sshd():
    running = "7|RUNNING|None|59:10|2026-11-30T05:27:13|a[1-2]"
    assert parse_allocation_status("7", answer(running, "ready=\nnodes=a1,a2\nsshd_ok=")).sshd
    assert not parse_allocation_status("7", answer(running, "ready=\nnodes=a1,a2")).sshd


def test_status_names_the_execs_that_ended_with_their_status():
    running = "7|RUNNING|None|59:10|2026-11-30T05:27:13|a[1-2]"
    status = parse_allocation_status("7", answer(running, "ready=\nexec=c-0001:0\nexec=c-0002:137\nexec=c-0003:\n"
                                                          "nodes=a1,a2"))
    assert (status.phase.value, status.nodes) == ("READY", ["a1", "a2"])
    assert status.ended_execs == {"c-0001": 0, "c-0002": 137}  # c-0003's marker is being written: not yet
    script = status_script([("7", ".corral/runs/dev-1")])
    assert "for f in \"$HOME\"/.corral/runs/dev-1/exec/*/ended; do" in script


def test_down_leaves_the_cancel_marker_before_its_scancel():
    from corral.infra.slurm.devscript import down_script

    lines = down_script("42", ".corral/runs/abc").splitlines()
    assert lines[:3] == ['[ -d "$HOME"/.corral/runs/abc ] && : > "$HOME"/.corral/runs/abc/cancelled',
                         "scancel 42 2>/dev/null", 'rm -rf "$HOME"/.corral/runs/abc']


def test_status_says_what_slurm_gave_the_allocation_per_node():
    running = "7|RUNNING|None|59:10|2026-11-30T05:27:13|a[1-2]"
    given = parse_allocation_status("7", answer(running, "ready=\nnodes=a1,a2\nheld=1:1000"))
    assert (given.cpus_per_node, given.memory_mb_per_node) == (1, 1000)
    for files in ("ready=\nnodes=a1,a2", "ready=\nheld=0:0", "ready=\nheld=garbage"):  # from before, or unknown
        status = parse_allocation_status("7", answer(running, files))
        assert (status.cpus_per_node, status.memory_mb_per_node) == (None, None), files
