"""Parsing job status and predictions from output recorded on the testbed."""

from corral.infra.slurm.jobs import _exit_code, parse_status, parse_submit, parse_test_only
from tests.conftest import FIXTURES


def fixture(name: str) -> str:
    return (FIXTURES / "jobs" / f"{name}.txt").read_text()


def test_status_of_all_my_jobs_from_one_squeue():
    statuses = {s.slurm_job_id: s for s in parse_status("alpine", fixture("alpine-status"))}
    assert statuses["5"].token == "aaaa11112222" and statuses["5"].state == "RUNNING"
    assert statuses["5"].ended_at is None and statuses["5"].started_at is not None
    assert statuses["6"].state == "PENDING" and statuses["6"].reason == "Resources"
    assert [statuses[f"7_{i}"].state for i in range(3)] == ["RUNNING", "PENDING", "PENDING"]
    assert statuses["3"].state == "FAILED" and statuses["3"].exit_code == 3
    assert statuses["1"].exit_code == 127
    assert statuses["2"].state == "SUCCEEDED" and statuses["2"].exit_code == 0
    assert statuses["8"].token is None  # not Corral's
    assert statuses["5"].submitted_at == 1796015347 - 4  # local times converted with the cluster's clock


def test_predictions():
    answers = parse_test_only(fixture("alpine-test-only"), 4)
    assert answers[0][0] == 1796015347 + 90 * 60 - 2
    assert answers[2][0] == 1796015347
    assert answers[3][0] is None and "Requested node configuration is not available" in answers[3][1]


def test_submit_answers():
    assert parse_submit("@@corral submitted 42 new\n").slurm_job_id == "42"
    assert parse_submit("@@corral submitted 42 existing\n").already_existed
    rejected = parse_submit("@@corral rejected 1\nsbatch: error: Batch job submission failed: Invalid account\n")
    assert not rejected.accepted and rejected.message == "Batch job submission failed: Invalid account"
    busy = parse_submit("@@corral rejected busy\nsbatch: error: Slurm temporarily unable to accept job, sleeping and "
                        "retrying\n")
    assert not busy.accepted and busy.message.startswith("Slurm is not accepting jobs now")


def test_exit_codes():
    assert _exit_code("768") == 3 and _exit_code("0") == 0 and _exit_code("9") == 137
    assert _exit_code("3:0") == 3 and _exit_code("0:15") == 143 and _exit_code("") is None


def test_a_pending_job_has_an_expected_start_and_no_start():
    statuses = {s.slurm_job_id: s for s in parse_status("alpine", fixture("alpine-pending-status"))}
    pending, blocker = statuses["7"], statuses["6"]
    assert pending.state == "PENDING" and pending.started_at is None
    # Backfill expects it to start when the 60-minute blocker ends.
    assert pending.expected_start == blocker.started_at + 3600 == 1796024619 + 3600 - 20
    assert blocker.expected_start is None
    assert statuses["3"].state == "FAILED" and statuses["3"].reason == "NodeDown"


def test_rejections_are_told_apart_from_lost_answers():
    from corral.infra.slurm.jobs import is_rejection, rejection_reason

    assert is_rejection(rejection_reason("alpine", "Invalid feature specification"))
    assert not is_rejection("alpine: no answer from the login node within 30s")
    assert not is_rejection(None)
