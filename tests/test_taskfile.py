"""Reading task files (corral/taskfile.py): a pipeline's (or a job group's) documents, as SkyPilot reads
such a file."""

from __future__ import annotations

import pytest

from corral.errors import TaskError
from corral.taskfile import parse_yaml, parse_yaml_documents, pipeline_tasks, repeated_keys

PIPELINE = """\
name: pipe   # the pipeline
---
name: train
resources:
  accelerators: A100:1
run: |
  python train.py
---
  # an indented task, with a comment
  name: eval
  run: python eval.py
"""


def test_a_pipeline_file_gives_its_name_and_each_tasks_own_text():
    header, tasks = pipeline_tasks(PIPELINE, "p.yaml")
    assert header == {"name": "pipe"}
    assert [value["name"] for _, value in tasks] == ["train", "eval"]
    for text, value in tasks:
        assert parse_yaml(text, "task") == value  # each text alone reads as the task it stands for
    assert tasks[0][0].startswith("name: train\n") and "---" not in tasks[0][0]


def test_without_a_header_every_document_is_a_task():
    header, tasks = pipeline_tasks("run: a\n---\nname: b\nrun: b\n", "p.yaml")
    assert header == {} and [value["run"] for _, value in tasks] == ["a", "b"]


@pytest.mark.parametrize("text", ["run: a\n", "---\nrun: a\n", "run: a\n---\n", "run: a\n---\n---\n", ""])
def test_a_file_of_one_task_is_no_pipeline(text):
    assert pipeline_tasks(text, "t.yaml") is None
    assert parse_yaml(text, "t.yaml") == ({"run": "a"} if text else None)


def test_a_single_task_launch_of_a_pipeline_says_where_it_runs():
    with pytest.raises(TaskError) as err:
        parse_yaml(PIPELINE, "p.yaml")
    assert str(err.value) == ("p.yaml: holds 3 YAML documents, a pipeline (or a job group) of tasks: launch it as a "
                              "managed job, `corral jobs launch p.yaml`")


def test_a_job_group_header_is_read_whole():
    header, tasks = pipeline_tasks("name: g\nexecution: parallel\nprimary_tasks: [a]\ntermination_delay: 30s\n"
                                   "---\nname: a\nrun: a\n---\nname: b\nrun: b\n", "g.yaml")
    assert header == {"name": "g", "execution": "parallel", "primary_tasks": ["a"], "termination_delay": "30s"}
    assert [value["name"] for _, value in tasks] == ["a", "b"]


@pytest.mark.parametrize("text, fragment", [
    ("name: p\nexecution: gang\n---\nrun: a\n---\nrun: b\n",
     "p.yaml: execution: 'gang': give `serial` (a pipeline, its tasks run one after another) or `parallel`"),
    ("name: p\nprimary_tasks: [a]\n---\nname: a\nrun: a\n---\nrun: b\n",
     "p.yaml: primary_tasks: only a job group has it (`execution: parallel` in the header)"),
    ("name: [1]\nexecution: parallel\n---\nrun: a\n", "p.yaml: the job group's name must be a string, not list"),
    ("execution: parallel\nprimary_tasks: trainer\n---\nrun: a\n", "p.yaml: primary_tasks: expected a list of the"),
    ("execution: parallel\ntermination_delay: [1]\n---\nrun: a\n", "p.yaml: termination_delay: expected a duration"),
    ("execution: parallel\ntermination_delay: {a: [1]}\n---\nrun: a\n", "p.yaml: termination_delay: expected a"),
    ("name: [1]\n---\nrun: a\n", "p.yaml: the pipeline's name must be a string, not list"),
    ("name: p\n---\nname: q\n", None),  # only the first document can be the header: `name: q` is a task
    ("run: a\n---\nrun: [b\n", "p.yaml:4:1: invalid YAML"),
])
def test_pipeline_files_that_cannot_run_say_why_and_where(text, fragment):
    if fragment is None:
        assert pipeline_tasks(text, "p.yaml") is not None
        return
    with pytest.raises(TaskError) as err:
        pipeline_tasks(text, "p.yaml")
    assert str(err.value).startswith(fragment), err.value


def test_the_size_bound_counts_every_document():
    one = "a: [" + ", ".join(["1"] * 4000) + "]\n"
    parse_yaml_documents(one, "p.yaml")  # 4,000 values: within the bound
    with pytest.raises(TaskError, match="YAML too large"):
        parse_yaml_documents("---\n".join([one] * 6), "p.yaml")


@pytest.mark.parametrize("text", [
    "\ufeffname: p\n---\nrun: a\n---\nrun: b\n",  # a byte order mark: YAML's marks count from after it
    "--- {run: a}\n--- {run: b}\n",  # a task on its `---` line
    "run: a\n---\n\ufeffrun: b\n",  # a stray mark inside: that task is written anew
])
def test_each_tasks_text_reads_alone_as_the_task_it_was_in_the_file(text):
    _, tasks = pipeline_tasks(text, "p.yaml")
    assert [parse_yaml(own, "task") for own, _ in tasks] == [{"run": "a"}, {"run": "b"}]


@pytest.mark.parametrize(("text", "repeated"), [
    ("envs: {A: 1}\nrun: x\nenvs: {B: 2}\n", ["envs"]),
    ("resources:\n  any_of:\n  - {accelerators: A100, accelerators: H100}\n  - {cpus: 1}\nrun: a\nrun: b\n",
     ["resources.any_of[0].accelerators", "run"]),
    ("run: a\nrun: b\nrun: c\n", ["run"]),  # said once
    ("base: &b {x: 1, y: 2}\nt:\n  <<: *b\n  x: 3\n", []),  # overriding a merge is what merges are for
    ("1: a\n'1': b\n", []),  # an int and a string: two keys
    ("a: &x {k: 1, k: 2}\nb: *x\n", ["a.k"]),  # told where it is written, not at each alias
    ("run: a\n---\nrun: b\nrun: c\n", ["run"]),
    ("run: [\n", []),  # not YAML: the loader's error says so
    ("envs: {A: 1}\nrun: x\n", []),
])
def test_keys_written_twice_are_found_by_their_path(text, repeated):
    assert repeated_keys(text) == repeated
