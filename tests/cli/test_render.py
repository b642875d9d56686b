"""What the CLI's tables print comes from people and clusters (job names, Slurm reasons, ssh errors): it
is shown as written. rich read `[/x]` in a job's name as a closing tag and `corral queue` ended in an
internal error (exit 70); `:fire:` became an emoji."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.cli import consoles, render
from corral.cli.managed_table import render_managed
from corral.sdk.types import GpuReport, Job, QueuePage, Unreachable
from tests.cli.test_queue import seed
from tests.helpers import run_cli

MARKUP_LIKE = ["[/x]", "a [bold]b[/bold]", ":fire: :smile:", "[link=http://x]y[/link]", "\\[red]"]


def job(name: str, state: str = "RUNNING", reason: str | None = None) -> Job:
    data = {"job_id": "c-000000000001", "name": name, "state": state, "cluster": "alpine", "partition": "gpu",
            "reason": reason}
    return Job.from_json(data)


def printed(show, *args) -> tuple[str, str]:
    with consoles.console.capture() as out, consoles.err_console.capture() as err:
        show(*args)
    return out.get(), err.get()


@pytest.mark.parametrize("text", MARKUP_LIKE)
def test_queue_and_managed_tables_show_names_and_reasons_as_written(text):
    out, _ = printed(render.render_queue, QueuePage([job(text, "PENDING", reason=text)], 0, {}, []))
    row = out.splitlines()[1]
    assert row.count(text) == 2 and "🔥" not in row
    out, _ = printed(render_managed, [{"job_id": "c-1", "name": text, "state": "FAILED", "attempts": 1,
                                       "reason": text, "cluster": None}])
    assert out.splitlines()[1].count(text) == 2


def test_a_job_that_failed_on_its_own_shows_its_exit_code_as_its_reason():
    def reason(state: str, why: str | None, code: int | None) -> str:
        shown = Job.from_json({"job_id": "c-1", "name": "t", "state": state, "cluster": "alpine", "partition": "cpu",
                               "reason": why, "exit_code": code})
        return printed(render.render_queue, QueuePage([shown], 0, {}, []))[0].splitlines()[1].split("FAILED")[-1]

    assert reason("FAILED", "NonZeroExitCode", 3).split()[:3] == ["exit", "code", "3"]  # Slurm's bare word before
    assert reason("FAILED", None, 127).split()[:3] == ["exit", "code", "127"]  # an exec's: nothing, before
    assert "NODE_FAIL" in reason("FAILED", "NODE_FAIL", None)  # a reason that says more is kept
    assert "exit code" not in printed(render.render_queue, QueuePage([job("t", "SUCCEEDED")], 0, {}, []))[0]


@pytest.mark.parametrize("text", MARKUP_LIKE)
def test_gpus_and_plans_show_a_clusters_words_as_written(text):
    failure = Unreachable("alpine", f"ssh: {text}", "unreachable", {})
    _, err = printed(render.render_gpus, GpuReport([], [failure]), None)
    assert f"✗ ssh: {text}" in err
    plan = [{"infra": "slurm/alpine/gpu", "feasible": False, "reason": text, "cluster": "alpine"},
            {"infra": "slurm/borealis", "unreachable": True, "reason": text, "cluster": "borealis"}]
    out, _ = printed(render.render_plan, plan, True)
    assert [line.rstrip().endswith(text) for line in out.splitlines()[1:]] == [True, True]


@settings(max_examples=300, deadline=None)
@given(st.text(st.characters(blacklist_categories=("Cc", "Cs", "Co", "Cn", "Zs", "Zl", "Zp", "Mn", "Me", "Cf")),
               min_size=1, max_size=40))
def test_any_name_is_printed_as_written(name):
    out, _ = printed(render.render_queue, QueuePage([job(name, "PENDING", reason=name)], 0, {}, []))
    assert "".join(out.split()).count(name) >= 2


def test_a_sweep_row_spans_its_first_start_to_its_last_end():
    jobs = [Job.from_json({"job_id": f"c-00{i}", "name": "lr", "state": "SUCCEEDED", "cluster": "alpine",
                           "partition": "gpu", "sweep_id": "c-000", "submitted_at": 0.0, "slurm_job_id": f"4711_{i}"})
            for i in range(3)]
    started, ended = render.when(60.0), render.when(3600.0)
    page = QueuePage(jobs, 0, {"c-000": {"SUCCEEDED": 3}}, [], {"c-000": [60.0, 3600.0]})
    out, _ = printed(render.render_queue, page)
    assert out.splitlines()[1].rstrip().endswith(f"{started}  {ended}")
    assert out.splitlines()[1].split()[5] == "4711"  # the Slurm array's id: `corral cancel 4711` takes it
    out, _ = printed(render.render_queue, QueuePage(jobs, 0, {"c-000": {"SUCCEEDED": 4}}, [], {}))
    assert out.splitlines()[1].split()[5] == "-"  # a job not on the page may be in another array
    out, _ = printed(render.render_queue, QueuePage(jobs, 0, {"c-000": {"RUNNING": 3}}, [], {"c-000": [60.0, None]}))
    assert out.splitlines()[1].rstrip().endswith(f"{started}  -")


def test_a_state_keeps_its_colour(monkeypatch):
    monkeypatch.setattr(consoles.console, "_force_terminal", True)
    monkeypatch.setattr(consoles.console, "_color_system", consoles.console._detect_color_system())
    out, _ = printed(render.render_queue, QueuePage([job("[/x]", "FAILED")], 0, {}, []))
    assert "\x1b[31mFAILED" in out and "[/x]" in out


def test_corral_queue_lists_a_job_whose_name_looks_like_markup(refusing_clusters):
    home = refusing_clusters / "home"
    home.mkdir(mode=0o700)
    seed(home, 3, name="[/x] :fire:")
    code, out, err = run_cli(["queue"])
    assert code == 0, err
    jobs = [line.split() for line in out.splitlines()[1:] if "(sweep)" not in line]
    assert [words[1:3] for words in jobs] == [["[/x]", ":fire:"]] * 3


def test_the_managed_table_keeps_a_pipelines_tasks_together_in_order_with_when_and_how_long():
    """Newest first, but a pipeline's tasks in the order they run (as `sky jobs queue` nests them), each
    named with its pipeline; SUBMITTED and DURATION (how long its attempts ran) as `sky jobs queue`."""
    def task(job_id, number, state, ran=None):
        return {"job_id": job_id, "name": f"t{number}", "state": state, "attempts": 1 if ran is not None else 0,
                "cluster": None, "created_at": 1_800_000_000.0, "run_seconds": ran,
                "pipeline": {"id": "c-p0", "name": "pipe", "task": number}}

    single = {"job_id": "c-s", "name": "single", "state": "RUNNING", "attempts": 1, "cluster": "alpine",
              "partition": "gpu", "created_at": 1_800_000_100.0, "run_seconds": 3725.0}
    out, _ = printed(render_managed, [single, task("c-p2", 2, "PENDING"), task("c-p0", 0, "SUCCEEDED", 12.0),
                                      task("c-p1", 1, "RUNNING", 61.0)])
    lines = out.splitlines()
    assert lines[0].split()[:8] == ["ID", "NAME", "STATE", "INFRA", "SLURM", "ID", "SUBMITTED", "DURATION"]
    assert [line.split()[0] for line in lines[1:]] == ["c-s", "c-p0", "c-p1", "c-p2"]
    assert "pipe/1: t1" in lines[3] and " 1m " in lines[3] and " 12s " in lines[2]
    assert " 1h02m " in lines[1]
    assert lines[4].split()[:4] == ["c-p2", "pipe/2:", "t2", "PENDING"] and " - " in lines[4]


def test_a_launch_no_place_can_run_prints_no_empty_plan_table():
    """The plan of a launch shows its feasible rows; with none, the error that follows says why, and an
    empty table's bare header said nothing."""
    infeasible = [{"infra": "slurm/alpine/gpu", "cluster": "alpine", "feasible": False,
                   "reason": "no A100 GPUs (has H100)"}]
    assert printed(render.render_plan, infeasible, False) == ("", "")
    out, _ = printed(render.render_plan, infeasible, True)  # --dryrun shows every row, with its reason
    assert "no A100 GPUs (has H100)" in out
    unreachable = [{"infra": "slurm/borealis", "cluster": "borealis", "unreachable": True, "reason": "timed out"}]
    assert "timed out" in printed(render.render_plan, infeasible + unreachable, False)[1]
