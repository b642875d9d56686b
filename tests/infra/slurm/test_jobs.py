"""Parsing job status and predictions from output recorded on the testbed."""

import pytest

from corral.errors import ProbeParseError, SlurmControllerError
from corral.infra.slurm.jobs import (
    StatusLines,
    _exit_code,
    light_lines,
    parse_status,
    parse_submit,
    parse_test_only,
    status_script,
    stopped_at_ping,
)
from corral.infra.slurm.probe import MARK
from tests.conftest import FIXTURES


def fixture(name: str) -> str:
    return (FIXTURES / "jobs" / f"{name}.txt").read_text()


def test_status_of_all_my_jobs_from_one_squeue():
    statuses = {s.handle: s for s in parse_status("alpine", fixture("alpine-status"))}
    assert statuses["5"].token == "aaaa11112222" and statuses["5"].state == "RUNNING"
    assert statuses["5"].ended_at is None and statuses["5"].started_at is not None
    assert statuses["6"].state == "PENDING" and statuses["6"].reason == "Resources"
    assert [statuses[f"7_{i}"].state for i in range(3)] == ["RUNNING", "PENDING", "PENDING"]
    assert statuses["3"].state == "FAILED" and statuses["3"].exit_code == 3
    assert statuses["1"].exit_code == 127
    assert statuses["2"].state == "SUCCEEDED" and statuses["2"].exit_code == 0
    assert statuses["8"].token is None  # not Corral's
    assert statuses["5"].submitted_at == 1796015347 - 4  # local times converted with the cluster's clock


def test_a_status_line_seen_in_the_last_query_is_looked_up_not_parsed_again():
    """A tick's squeue is mostly the last one's lines: those give the statuses parsed before (the same
    objects); a changed line, or a cluster clock at another offset, is parsed afresh, and a line gone
    from the queue is forgotten."""
    output = fixture("alpine-status")
    lines = StatusLines()
    first = {s.handle: s for s in parse_status("alpine", output, lines)}
    assert first == {s.handle: s for s in parse_status("alpine", output)}  # as without the lines
    running = next(line for line in output.splitlines() if line.startswith("5|"))
    ended = running.replace("|RUNNING|", "|COMPLETED|")
    second = {s.handle: s for s in parse_status("alpine", output.replace(running, ended), lines)}
    assert all(second[h] is first[h] for h in first if h != "5")
    assert second["5"].state == "SUCCEEDED" and first["5"].state == "RUNNING"
    assert running not in lines.parsed and ended in lines.parsed
    # Ten seconds later by the clock, the same offset: still looked up.
    later = output.replace("1796015347\n2026-11-30T05:09:07", "1796015357\n2026-11-30T05:09:17")
    third = {s.handle: s for s in parse_status("alpine", later, lines)}
    assert third["6"] is first["6"]
    # The cluster's clock moved an hour against UTC (a time zone change): every line is parsed again.
    moved = output.replace("1796015347\n2026-11-30T05:09:07", "1796015347\n2026-11-30T06:09:07")
    fourth = {s.handle: s for s in parse_status("alpine", moved, lines)}
    assert fourth["6"] is not first["6"] and fourth["6"].submitted_at == first["6"].submitted_at - 3600


DIGEST = "0123456789abcdef0123456789abcdef"


def test_an_answer_that_stopped_after_the_light_query_is_the_last_full_one():
    """The light query's digest is kept with the full query it came with; an answer that stopped after
    it (nothing changed) gives that query's statuses, and is told apart from a cut-off answer."""
    output = fixture("alpine-status")
    clock = output[:output.index(f"{MARK} squeue")]
    lines = StatusLines()
    full = parse_status("alpine", output.replace(clock, clock + f"\n{MARK} light 0\n{DIGEST}\n", 1), lines, now=5.0)
    assert lines.light is True and lines.digest == DIGEST and lines.full_at == 5.0 and not lines.light_only
    unchanged = parse_status("alpine", f"{clock}\n{MARK} light 0\n{DIGEST}\n", lines, now=9.0)
    assert unchanged == full and lines.light_only and lines.full_at == 5.0
    with pytest.raises(ProbeParseError):  # another digest, and no full query after it: cut off
        parse_status("alpine", f"{clock}\n{MARK} light 0\n{DIGEST[::-1]}\n", lines)
    assert not lines.light_only
    # Two refreshes at once: one compared with the digest it was given, while the other's full query
    # answered and kept a newer one. The first is still an answer, with the newer statuses.
    lines.digest = DIGEST[::-1]
    assert parse_status("alpine", f"{clock}\n{MARK} light 0\n{DIGEST}\n", lines, asked=DIGEST) == full
    assert lines.light_only


def test_a_squeue_without_the_light_option_is_not_asked_again():
    output = fixture("alpine-status")
    clock = output[:output.index(f"{MARK} squeue")]
    refused = (f"\n{MARK} light 1\nsqueue: unrecognized option '--only-job-state'\n"
               "Try \"squeue --help\" for more information\n")
    lines = StatusLines()
    statuses = parse_status("alpine", output.replace(clock, clock + refused, 1), lines)
    assert lines.light is False and lines.digest == "" and len(statuses) == len(parse_status("alpine", output))
    busy = StatusLines()  # a controller that did not answer says nothing about the option
    parse_status("alpine", output.replace(clock, clock + f"\n{MARK} light 1\nsqueue: error: Socket timed out\n", 1), busy)
    assert busy.light is None


def test_the_light_query_takes_only_a_digest():
    assert any(DIGEST in line for line in light_lines("12 13_4", DIGEST))
    with pytest.raises(ValueError):
        light_lines("12", "$(reboot)")


def test_after_a_failed_query_the_controller_is_pinged_first_and_a_down_one_ends_it_there():
    """Recorded on the testbed with alpine's slurmctld stopped: squeue took 8.3 s to give up, `scontrol
    ping` 0.3 s to say DOWN."""
    pinged = status_script(["12"], ping_within=5)
    assert pinged.index("timeout 5 scontrol ping") < pinged.index("squeue")
    assert "scontrol ping" not in status_script(["12"])
    down = fixture("alpine-controller-down-status")
    assert stopped_at_ping(down) and not stopped_at_ping(fixture("alpine-status"))
    lines = StatusLines()
    with pytest.raises(SlurmControllerError, match=r"^alpine: its Slurm controller does not answer: scontrol ping: "
                                                   r"Slurmctld\(primary\) at alpine-ctl is DOWN$"):
        parse_status("alpine", down, lines)


def test_predictions():
    answers = parse_test_only(fixture("alpine-test-only"), 4)
    assert answers[0][0] == 1796015347 + 90 * 60 - 2
    assert answers[2][0] == 1796015347
    assert answers[3][0] is None and "Requested node configuration is not available" in answers[3][1]


def test_predictions_where_the_login_node_has_no_room_for_a_temporary_folder():
    """Recorded with /tmp mounted read-only and an unwritable home: each candidate says why."""
    [(start, words)] = parse_test_only(fixture("test-only-no-scratch"), 1)
    assert start is None and words.startswith("the login node has no room for a temporary folder in $TMPDIR, "
                                              "/tmp or the home folder (mktemp: failed to create directory")


def test_submit_answers():
    assert parse_submit("@@corral submitted 42 new\n").handle == "42"
    assert parse_submit("@@corral submitted 42 existing\n").already_existed
    rejected = parse_submit("@@corral rejected 1\nsbatch: error: Batch job submission failed: Invalid account\n")
    assert not rejected.accepted and rejected.message == "sbatch rejected the job: Batch job submission failed: Invalid account"
    busy = parse_submit("@@corral rejected busy\nsbatch: error: Slurm temporarily unable to accept job, sleeping and "
                        "retrying\n")
    assert not busy.accepted and busy.message.startswith("sbatch rejected the job: Slurm is not accepting jobs now")


def test_exit_codes():
    assert _exit_code("768") == 3 and _exit_code("0") == 0 and _exit_code("9") == 137
    assert _exit_code("3:0") == 3 and _exit_code("0:15") == 143 and _exit_code("") is None


def test_a_pending_job_has_an_expected_start_and_no_start():
    statuses = {s.handle: s for s in parse_status("alpine", fixture("alpine-pending-status"))}
    pending, blocker = statuses["7"], statuses["6"]
    assert pending.state == "PENDING" and pending.started_at is None
    # Backfill expects it to start when the 60-minute blocker ends.
    assert pending.expected_start == blocker.started_at + 3600 == 1796024619 + 3600 - 20
    assert blocker.expected_start is None
    assert statuses["3"].state == "FAILED" and statuses["3"].reason == "NodeDown"


def test_failed_states_carry_a_failure_class():
    """The controller's rules read the class: the task's own failure, or the infrastructure's."""
    from corral.infra.base import FailureClass, JobState
    from corral.infra.slurm.jobs import _status, parse_clock

    clock = parse_clock("1796015347 2026-12-01T10:00:00")

    def status(state: str):
        return _status(["9", "corral-aaaa11112222", state, "None", "", "", "", "0:0", "gpu", "(null)"], clock.to_epoch)

    assert status("NODE_FAIL").failure is FailureClass.INFRA and status("PREEMPTED").failure is FailureClass.INFRA
    assert status("BOOT_FAIL").state is JobState.FAILED and status("BOOT_FAIL").failure is FailureClass.INFRA
    assert status("TIMEOUT").failure is FailureClass.TASK and status("OUT_OF_MEMORY").failure is FailureClass.TASK
    assert status("FAILED").failure is FailureClass.TASK and status("FAILED").native_state == "FAILED"
    assert status("COMPLETED").failure is None and status("RUNNING").failure is None


def test_a_corral_job_slurm_could_not_launch_is_an_infrastructure_failure():
    # Recorded on the testbed: a job named as Corral names its own, its output in a missing directory.
    statuses = {s.handle: s for s in parse_status("borealis", fixture("borealis-launch-failure-status"))}
    failed = statuses["35"]
    assert (failed.state, failed.reason, failed.token) == ("FAILED", "JobLaunchFailure", "1a0f2b3c4d5e")
    assert failed.failure == "infra"  # the controller recovers it elsewhere, as after NODE_FAIL
    assert statuses["5"].failure is None and statuses["24"].token is None


def test_a_users_own_script_slurm_could_not_launch_stays_the_tasks_failure():
    """Its own #SBATCH --output may be what failed, on every cluster alike: recovering would loop."""
    from corral.infra.slurm import userscript
    from corral.infra.slurm.jobs import _status, parse_clock

    clock = parse_clock("1796015347 2026-12-01T10:00:00")
    mine = _status(["9", "train", "FAILED", "JobLaunchFailure", "", "", "", "0:53", "gpu",
                    f"{userscript.COMMENT_PREFIX}aaaa11112222"], clock.to_epoch)
    assert mine.token == "aaaa11112222" and mine.failure == "task"
    corral = _status(["9", "corral-aaaa11112222", "FAILED", "SystemFailure", "", "", "", "0:0", "gpu", "(null)"],
                     clock.to_epoch)
    assert corral.failure == "infra"


def test_a_job_the_step_start_bound_ended_is_an_infrastructure_failure_with_its_reason():
    # Recorded on the testbed: b2's slurmd frozen, the bound at 4 s (tests/cli/test_jobs.py).
    [status] = parse_status("borealis", fixture("borealis-step-bound-status"))
    assert status.state == "FAILED" and status.failure == "infra" and status.token == "ac8a1a323b5c"
    assert status.reason == ("the srun step started on 1 of 2 node(s) within 4 s of the batch script; "
                             "Corral ended the job")
