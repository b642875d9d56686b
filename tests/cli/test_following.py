"""Following a job to its end, on a client that answers from a script of states (no server): which
output is printed in what order, what is said on stderr, and the exit status."""

from __future__ import annotations

import pytest

from corral.cli import following
from corral.sdk.types import Job
from corral.timefmt import clock


def attempt(number: int, state: str, exit_code: int | None = None, slurm_job_id: str | None = "7") -> dict:
    return {"number": number, "cluster": "alpine", "partition": "gpu", "slurm_job_id": slurm_job_id,
            "state": state, "exit_code": exit_code}


class ScriptedManaged:
    """Answers `managed_job` from a list of snapshots, one per call (the last one repeats)."""

    def __init__(self, snapshots: list[dict]):
        self.snapshots = snapshots
        self.asked = 0
        self.streams: list[tuple[int, bool, int]] = []

    def managed_job(self, job: str) -> dict:
        snapshot = self.snapshots[min(self.asked, len(self.snapshots) - 1)]
        self.asked += 1
        return {"job_id": "c-1", "reason": None, **snapshot}

    def managed_logs(self, job: str, number: int, follow: bool = False, *, tail: int = 0):
        self.streams.append((number, follow, tail))
        yield f"out {number}\n".encode()


@pytest.fixture(autouse=True)
def no_waiting(monkeypatch):
    monkeypatch.setattr(following.time, "sleep", lambda seconds: None)


def test_a_managed_job_is_followed_through_its_recovery_to_its_end(capfd):
    client = ScriptedManaged([
        {"state": "PENDING", "attempt_list": []},
        {"state": "RUNNING", "attempt_list": [attempt(1, "RUNNING")]},
        {"state": "RUNNING", "attempt_list": [attempt(1, "FAILED", 3)]},  # the tick has not seen it yet
        {"state": "RECOVERING", "reason": "node failure", "attempt_list": [attempt(1, "FAILED", 3)]},
        {"state": "RUNNING", "attempt_list": [attempt(1, "FAILED", 3), attempt(2, "RUNNING")]},
        {"state": "SUCCEEDED", "reason": "attempt 2 succeeded",
         "attempt_list": [attempt(1, "FAILED", 3), attempt(2, "SUCCEEDED", 0)]},
    ])
    assert following.follow_managed(client, "c-1", follow=True) == 0
    out, err = capfd.readouterr()
    assert out == "out 1\nout 2\n"
    assert client.streams == [(1, True, 0), (2, True, 0)]  # each followed once, as it came
    assert err.splitlines() == [
        "corral: c-1 PENDING",  # before any attempt reached a cluster
        "== attempt 1 on slurm/alpine/gpu (Slurm job 7, RUNNING) ==",
        "corral: c-1 RECOVERING (node failure)",  # not the stale RUNNING between the attempts
        "== attempt 2 on slurm/alpine/gpu (Slurm job 7, RUNNING) ==",
        "corral: c-1 SUCCEEDED on slurm/alpine/gpu (exit code 0, 2 attempts): attempt 2 succeeded",
    ]


def test_an_attempt_pending_in_slurm_is_a_waiting_line_until_it_starts(capfd):
    import time

    soon = time.time() + 3600
    waiting = {"state": "PENDING", "reason": "Resources", "cluster": "alpine", "partition": "gpu",
               "expected_start": soon, "attempt_list": [attempt(1, "PENDING")]}
    client = ScriptedManaged([waiting, waiting, {**waiting, "state": "RUNNING", "reason": None, "expected_start": None,
                                                 "attempt_list": [attempt(1, "RUNNING")]},
                              {"state": "SUCCEEDED", "attempt_list": [attempt(1, "SUCCEEDED", 0)]}])
    assert following.follow_managed(client, "c-1", follow=True) == 0
    out, err = capfd.readouterr()
    assert out == "out 1\n" and client.streams == [(1, True, 0)]  # followed once it ran, not while pending
    assert err.splitlines()[:2] == [
        f"corral: c-1 PENDING on slurm/alpine/gpu (Resources); Slurm expects it to start {clock(soon)}",
        "== attempt 1 on slurm/alpine/gpu (Slurm job 7, RUNNING) ==",  # said once, though asked twice
    ]


def test_a_failed_managed_job_exits_with_its_last_attempts_code_and_without_follow_with_0(capfd):
    ended = {"state": "FAILED", "attempt_list": [attempt(1, "FAILED", 3), attempt(2, "FAILED", 4)]}
    assert following.follow_managed(ScriptedManaged([ended]), "c-1", follow=True) == 4
    assert following.follow_managed(ScriptedManaged([ended]), "c-1", follow=False) == 0
    tailed = ScriptedManaged([ended])
    assert following.follow_managed(tailed, "c-1", follow=False, tail=5) == 0
    assert tailed.streams == [(2, False, 5)]  # --tail: the current attempt only
    cancelled = {"state": "CANCELLED", "attempt_list": [attempt(1, "CANCELLED")]}
    assert following.follow_managed(ScriptedManaged([cancelled]), "c-1", follow=True) == 1


def test_an_attempt_that_never_reached_a_cluster_has_no_header():
    client = ScriptedManaged([{"state": "FAILED", "attempt_list": [attempt(1, "SUBMIT_FAILED", slurm_job_id=None)]}])
    assert following.follow_managed(client, "c-1", follow=True) == 1 and client.streams == []


class OneJob:
    def __init__(self, states: list[str], exit_code: int | None = None):
        self.states, self.exit_code, self.asked = states, exit_code, 0

    def job(self, job: str) -> Job:
        state = self.states[min(self.asked, len(self.states) - 1)]
        self.asked += 1
        return Job.from_json({"job_id": "c-2", "name": "t", "state": state, "cluster": "alpine", "partition": "cpu",
                              "exit_code": self.exit_code})

    def wait(self, job: str, *, poll: float, timeout: float) -> Job:
        while not (found := self.job(job)).ended:
            pass
        return found


@pytest.mark.parametrize(("state", "code", "status"), [("SUCCEEDED", 0, 0), ("FAILED", 7, 7), ("CANCELLED", None, 1),
                                                       ("LOST", None, 1)])
def test_a_followed_job_exits_as_it_ended(capfd, state, code, status):
    assert following.report_end(OneJob(["RUNNING", state], code), "c-2") == status
    said = "no exit code" if code is None else f"exit code {code}"  # never "exit code None"
    assert capfd.readouterr().err == f"corral: c-2 {state} on slurm/alpine/cpu ({said})\n"


def test_a_follow_cut_off_by_the_cluster_is_69_at_once_unless_the_job_had_ended(capfd):
    from corral.errors import ClusterUnreachableError, stream_error_line
    from corral.sdk import _cut_raised

    cut = stream_error_line(ClusterUnreachableError("cirrus", "lost the connection"))
    said = following.print_output(_cut_raised(iter([b"line-1\n", cut[:9], cut[9:]])))
    assert said is not None and said.exit_code == 69 and str(said) == "cirrus: lost the connection"
    assert capfd.readouterr() == ("line-1\n", "corral: error: cirrus: lost the connection\n")  # its word on stderr
    # the job's own lines that read so are its output, wherever they are
    own = [b"line-1\ncorral: error: mine\nline-2\n", b"corral: error: mine too\n"]
    assert following.print_output(_cut_raised(iter(own))) is None
    assert capfd.readouterr().out == b"".join(own).decode()
    live = OneJob(["RUNNING"])
    assert following.report_end(live, "c-2", broken=True) == 69 and live.asked == 1  # no wait for an end
    assert "stopped following c-2, still RUNNING" in capfd.readouterr().err
    assert following.report_end(OneJob(["SUCCEEDED"], 0), "c-2", broken=True) == 0


@pytest.mark.parametrize(("state", "code", "status", "line"), [
    ("SUCCEEDED", 0, 0, "c-2 SUCCEEDED on slurm/alpine/cpu (exit code 0)"),
    ("FAILED", 7, 7, "c-2 FAILED on slurm/alpine/cpu (exit code 7)"),
    ("CANCELLED", None, 1, "c-2 CANCELLED on slurm/alpine/cpu (no exit code)"),
    ("RUNNING", None, 75, "c-2 RUNNING on slurm/alpine/cpu"),
    ("SUBMITTING", None, 75, "c-2 SUBMITTING on slurm/alpine/cpu")])
def test_status_only_prints_the_state_and_exits_75_until_the_job_has_ended(capfd, state, code, status, line):
    assert following.status_only(OneJob([state], code).job("c-2")) == status
    assert capfd.readouterr().out == line + "\n"


def test_status_only_of_a_managed_job_takes_its_last_attempts_exit_code(capfd):
    from corral.sdk.types import ManagedJob

    found = ManagedJob.from_json({"job_id": "c-1", "name": "t", "state": "FAILED", "cluster": "alpine",
                                  "partition": "gpu", "attempt_list": [attempt(1, "FAILED", 3), attempt(2, "FAILED", 9)]})
    assert following.status_only(found) == 9
    assert capfd.readouterr().out == "c-1 FAILED on slurm/alpine/gpu (exit code 9)\n"


class Ended:
    """Answers `wait` with each job's end at once; `interrupt_at`: Ctrl-C while waiting for that one."""

    def __init__(self, ends: dict[str, tuple[str, int | None]], interrupt_at: str | None = None):
        self.ends = ends
        self.interrupt_at = interrupt_at
        self.waited: list[str] = []

    def wait(self, job_id: str, *, poll: float) -> Job:
        self.waited.append(job_id)
        if job_id == self.interrupt_at:
            raise KeyboardInterrupt
        state, code = self.ends[job_id]
        return Job.from_json({"job_id": job_id, "name": "x", "state": state, "cluster": "alpine", "partition": "cpu",
                              "exit_code": code})


def test_sbatch_wait_exits_with_the_highest_exit_code_of_an_arrays_tasks(capfd):
    """`corral sbatch -W`: sbatch's rule, the highest exit code; one line on stderr for all of them."""
    client = Ended({"c-0": ("SUCCEEDED", 0), "c-1": ("FAILED", 2), "c-2": ("FAILED", 7), "c-3": ("CANCELLED", None)})
    assert following.wait_quietly(client, ["c-0", "c-1", "c-2", "c-3"]) == 7
    assert capfd.readouterr().err == ("corral: 4 jobs ended: 2 FAILED, 1 SUCCEEDED, 1 CANCELLED; highest exit "
                                      "code 7 (c-2)\n")
    assert following.wait_quietly(Ended({"c-9": ("CANCELLED", None)}), ["c-9"]) == 1  # no exit code: 1, as sbatch
    assert capfd.readouterr().err == "corral: c-9 CANCELLED on slurm/alpine/cpu\n"


def test_ctrl_c_while_sbatch_waits_names_the_jobs_still_running(capfd):
    client = Ended({f"c-{i}": ("SUCCEEDED", 0) for i in range(6)}, interrupt_at="c-1")
    assert following.wait_quietly(client, [f"c-{i}" for i in range(6)]) == 130
    err = capfd.readouterr().err
    assert "corral: c-1 and 4 more keep running; Ctrl-C only stopped waiting. `corral cancel c-1 c-2 c-3 …` stops " \
           "them." in err
    assert client.waited == ["c-0", "c-1"]


class ScriptedPipeline:
    """A pipeline's tasks, each answering `managed_job` with its own list of snapshots."""

    def __init__(self, tasks: dict[str, list[dict]], interrupt_on: str | None = None, auxiliary: tuple[str, ...] = (),
                 parallel: bool = False):
        self.tasks = {job: ScriptedManaged(snapshots) for job, snapshots in tasks.items()}
        self.order = list(tasks)
        self.interrupt_on = interrupt_on
        self.asked: list[str] = []
        self.auxiliary, self.execution = list(auxiliary), "parallel" if parallel else "serial"

    def managed_job(self, job: str) -> dict:
        self.asked.append(job)
        if job == self.interrupt_on:
            raise KeyboardInterrupt
        answer = self.tasks[job].managed_job(job)
        return {**answer, "job_id": job, "pipeline": {"id": self.order[0], "name": "pipe", "task": self.order.index(job),
                                                      "execution": self.execution},
                "pipeline_tasks": self.order, "pipeline_auxiliary": self.auxiliary}

    def managed_logs(self, job: str, number: int, follow: bool = False, *, tail: int = 0):
        yield f"{job} out\n".encode()


def test_a_pipeline_is_followed_task_after_task_from_the_task_given(capfd):
    client = ScriptedPipeline({
        "c-0": [{"state": "SUCCEEDED", "attempt_list": [attempt(1, "SUCCEEDED", 0)]}],
        "c-1": [{"state": "PENDING", "reason": "waiting for the pipeline's task 0 (c-0) to succeed", "attempt_list": []},
                {"state": "SUCCEEDED", "attempt_list": [attempt(1, "SUCCEEDED", 0)]}],
        "c-2": [{"state": "SUCCEEDED", "attempt_list": [attempt(1, "SUCCEEDED", 0)]}],
    })
    assert following.follow_managed(client, "c-1", follow=True) == 0
    out, err = capfd.readouterr()
    assert out == "c-1 out\nc-2 out\n"  # from the task given on: `jobs logs` of a later task
    assert "=== pipeline pipe, task 2: c-2 ===" in err and "task 1: c-1 ===" not in err
    assert following.follow_managed(client, "c-2", follow=False) == 0  # without follow: that task alone
    assert capfd.readouterr().out == "c-2 out\n"


def test_a_pipeline_followed_stops_at_a_failed_task_and_says_the_rest_are_skipped(capfd):
    client = ScriptedPipeline({
        "c-0": [{"state": "FAILED", "attempt_list": [attempt(1, "FAILED", 4)]}],
        "c-1": [{"state": "CANCELLED", "reason": "skipped", "attempt_list": []}],
    })
    assert following.follow_managed(client, "c-0", follow=True) == 4
    _, err = capfd.readouterr()
    assert "corral: pipeline pipe stopped at task 0: the tasks after it are skipped" in err
    assert client.asked.count("c-1") == 0


def test_ctrl_c_while_following_a_pipeline_says_its_other_tasks_go_on(capfd):
    client = ScriptedPipeline({
        "c-0": [{"state": "SUCCEEDED", "attempt_list": [attempt(1, "SUCCEEDED", 0)]}],
        "c-1": [{"state": "PENDING", "attempt_list": []}],
        "c-2": [{"state": "PENDING", "attempt_list": []}],
    }, interrupt_on="c-1")
    assert following.follow_managed(client, "c-0", follow=True) == 130
    _, err = capfd.readouterr()
    assert "c-1 keeps running; Ctrl-C only stopped following it" in err
    assert "pipeline pipe's later tasks go on as well; `corral jobs cancel pipe` cancels them all." in err


def test_a_job_group_is_followed_primary_tasks_first_and_exits_as_they_did(capfd):
    """Its tasks run side by side: each is followed to its end in turn, the primary ones first; the
    exit status is the first failed primary task's, and the auxiliary one its group stopped counts for
    nothing."""
    client = ScriptedPipeline({
        "c-0": [{"state": "CANCELLED", "reason": "stopped", "attempt_list": [attempt(1, "CANCELLED", None)]}],
        "c-1": [{"state": "SUCCEEDED", "attempt_list": [attempt(1, "SUCCEEDED", 0)]}],
        "c-2": [{"state": "FAILED", "attempt_list": [attempt(1, "FAILED", 5)]}],
    }, auxiliary=("c-0",), parallel=True)
    assert following.follow_managed(client, "c-1", follow=True) == 5
    out, err = capfd.readouterr()
    assert out == "c-1 out\nc-2 out\nc-0 out\n"
    assert "=== job group pipe, task 2: c-2 ===" in err and "=== job group pipe, task 0 (auxiliary): c-0 ===" in err
    client.tasks["c-2"] = ScriptedManaged([{"state": "SUCCEEDED", "attempt_list": [attempt(1, "SUCCEEDED", 0)]}])
    assert following.follow_managed(client, "c-1", follow=True) == 0  # the stopped server is no failure


def test_ctrl_c_while_following_a_job_group_says_its_tasks_go_on(capfd):
    client = ScriptedPipeline({"c-0": [{"state": "SUCCEEDED", "attempt_list": [attempt(1, "SUCCEEDED", 0)]}],
                               "c-1": [{"state": "RUNNING", "attempt_list": []}]}, interrupt_on="c-1", parallel=True)
    assert following.follow_managed(client, "c-0", follow=True) == 130
    assert "job group pipe's tasks go on; `corral jobs cancel pipe` cancels them all." in capfd.readouterr().err


def test_jobs_logs_task_names_one_task_of_a_pipeline_by_place_or_name():
    import click

    from corral.cli.jobs import pipeline_task

    found = {"job_id": "c-0", "pipeline_tasks": ["c-0", "c-1", "c-2"],
             "pipeline_task_names": ["train", "eval", "eval"]}
    assert pipeline_task(found, "1") == "c-1" and pipeline_task(found, "train") == "c-0"
    for unclear in ("eval", "3", "report"):  # two tasks named so; no such place; no such name
        with pytest.raises(click.UsageError, match=r"give one task's place or name: 0 \(train\), 1 \(eval\), 2 \(eval\)"):
            pipeline_task(found, unclear)
    with pytest.raises(click.UsageError, match="c-9 is one managed job, not a pipeline or job group"):
        pipeline_task({"job_id": "c-9", "pipeline_tasks": []}, "0")


def test_one_task_asked_for_is_followed_alone():
    client = ScriptedPipeline({"c-0": [{"state": "SUCCEEDED", "attempt_list": [attempt(1, "SUCCEEDED", 0)]}],
                               "c-1": [{"state": "SUCCEEDED", "attempt_list": [attempt(1, "SUCCEEDED", 0)]}]})
    assert following.follow_managed(client, "c-0", follow=True, whole=False) == 0
    assert "c-1" not in client.asked
