"""Property: any task file, of any shape, either plans or is refused with one line, in bounded time
and memory. Planning runs on snapshots parsed from recorded real probe output."""

from __future__ import annotations

import string
import time
import tracemalloc
from pathlib import Path

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.placement import build_plan
from corral.task import Task, TaskError, load_task, resource_options
from corral.taskfile import repeated_keys
from tests.test_placement import ORDER, SNAPSHOTS

FIELDS = {
    None: ["name", "workdir", "num_nodes", "resources", "envs", "secrets", "file_mounts", "setup", "run", "slurm",
           "checkpoint", "nmae"],
    "resources": ["accelerators", "cpus", "memory", "infra", "image_id", "job_recovery", "any_of", "ordered"],
    "slurm": ["time", "account", "qos", "constraint", "reservation", "sbatch_args"],
}
WORDS = ["H100:8", "H100", "l4:1", "gpu:2", "B300:0", "8+", "-1", "slurm", "slurm/alpine/gpu", "slurm/nope",
         "k8s/x", "4:00:00", "--exclusive", "--output=/tmp/x", "x\ntouch /tmp/p", "-esh -c 'touch /tmp/p' #",
         "docker:ubuntu", "CORRAL_X", "", " ", "\x00", "é", "1e309", "nan"]
scalars = st.one_of(st.none(), st.booleans(), st.integers(-2**70, 2**70), st.floats(allow_nan=True),
                    st.sampled_from(WORDS), st.text(max_size=20))


def values(depth: int = 3) -> st.SearchStrategy:
    if depth == 0:
        return scalars
    inner = values(depth - 1)
    keys = st.one_of(st.sampled_from(sum(FIELDS.values(), [])), st.text(max_size=8))
    return st.one_of(scalars, st.lists(inner, max_size=4), st.dictionaries(keys, inner, max_size=4))


def section(name: str | None) -> st.SearchStrategy:
    return st.dictionaries(st.sampled_from(FIELDS[name]), values(), max_size=6)


tasks = st.builds(lambda top, res, slurm: {**top, **({"resources": res} if res else {}),
                                           **({"slurm": slurm} if slurm else {})},
                  section(None), section("resources"), section("slurm"))
yaml_text = st.text(alphabet=string.printable + "é\x00\x85\ufeff", max_size=300)


def plans_or_refuses(path: Path) -> None:
    tracemalloc.start()
    started = time.monotonic()
    # the keys written twice, which the server warns of: found or none, never an exception
    assert all(isinstance(key, str) for key in repeated_keys(path.read_bytes().decode("utf-8", errors="replace")))
    try:
        task = load_task(path)
    except TaskError as exc:
        assert str(exc) and "\n" not in str(exc), repr(str(exc))
    else:
        assert isinstance(task, Task)
        build_plan(task, resource_options(task.resources), SNAPSHOTS, ORDER)
    finally:
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    assert time.monotonic() - started < 2.0
    assert peak < 64 * 2**20


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=tasks)
def test_structured_task_files(tmp_path, data):
    path = tmp_path / "task.yaml"
    path.write_text(yaml.safe_dump(data, allow_unicode=True))
    plans_or_refuses(path)


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(text=yaml_text)
def test_any_text(tmp_path, text):
    path = tmp_path / "task.yaml"
    path.write_bytes(text.encode("utf-8", errors="surrogatepass"))
    plans_or_refuses(path)


@settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(raw=st.binary(max_size=200))
def test_any_bytes(tmp_path, raw):
    path = tmp_path / "task.yaml"
    path.write_bytes(raw)
    plans_or_refuses(path)


def reads_as_a_pipeline_or_refuses(text: str) -> None:
    """A pipeline file (several documents) gives its tasks, each of which plans or is refused with one
    line, as the server would read it; anything else is refused with one line, never a traceback."""
    from corral.task import parse_task
    from corral.taskfile import parse_yaml, pipeline_tasks

    try:
        found = pipeline_tasks(text, "p.yaml")
    except TaskError as exc:
        assert str(exc) and "\n" not in str(exc), repr(str(exc))
        return
    for document_text, value in found[1] if found else []:
        # each task's text reads alone as it did in the file (repr: a NaN is equal to no NaN)
        assert repr(parse_yaml(document_text, "task")) == repr(value)
        try:
            parse_task(value, "p.yaml, task")
        except TaskError as exc:
            assert str(exc) and "\n" not in str(exc), repr(str(exc))


@settings(max_examples=200, deadline=None)
@given(documents=st.lists(st.one_of(tasks, st.just({"name": "pipe"}), st.just({"execution": "parallel"}),
                                    st.just({"execution": "parallel", "primary_tasks": ["a"], "termination_delay": "5s"}),
                                    st.just({"primary_tasks": ["a"]})),
                          min_size=1, max_size=4))
def test_structured_pipeline_files(documents):
    reads_as_a_pipeline_or_refuses("---\n".join(yaml.safe_dump(d, allow_unicode=True) for d in documents))


@settings(max_examples=300, deadline=None)
@given(text=st.lists(yaml_text, min_size=1, max_size=3))
def test_any_text_as_a_pipeline(text):
    reads_as_a_pipeline_or_refuses("\n---\n".join(text))
