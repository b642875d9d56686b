"""Task files that try to break out of their fields, or to exhaust time and memory: each is refused
with one clear line, fast, without reading more than the size limit."""

from __future__ import annotations

import time
import tracemalloc
from pathlib import Path

import pytest

from corral.infra.slurm.jobscript import SlurmJobSpec, UnsafeScriptValueError, render_sbatch, sbatch_options
from corral.task import (
    MAX_TASK_FILE_BYTES,
    MAX_YAML_NODES,
    TaskError,
    apply_overrides,
    job_environment,
    load_task,
    parse_task,
    redacted_json,
)


def write(tmp_path: Path, text: str | bytes) -> Path:
    path = tmp_path / "task.yaml"
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def refused(data: dict, *fragments: str) -> str:
    with pytest.raises(TaskError) as err:
        parse_task(data, "t.yaml")
    message = str(err.value)
    assert "\n" not in message and message.startswith("t.yaml: invalid task: ")
    for fragment in fragments:
        assert fragment in message
    return message


@pytest.mark.parametrize("field", ["account", "qos", "reservation", "constraint"])
@pytest.mark.parametrize("value", ["x\ntouch /tmp/p", "x\rtouch", "a b", "--output=/tmp/x x", "x\x00"])
def test_sbatch_values_cannot_end_or_split_their_line(field, value):
    refused({"slurm": {field: value}}, f"slurm.{field}: invalid {field}")


def test_well_formed_sbatch_values_pass():
    task = parse_task({"slurm": {"account": "proj-123_a", "qos": "high", "reservation": "r1,r2",
                                 "constraint": "(a100&ib)|[h100*2]", "sbatch_args": ["--exclusive", "-x", "--comment=n"]}},
                      "t")
    assert task.slurm.constraint == "(a100&ib)|[h100*2]"


@pytest.mark.parametrize("arg", ["--output=/tmp/x", "-o/tmp/x", "--job-name=x", "-Jx", "--array=0-3", "--wrap=id",
                                 "--chdir=/", "-M", "--clusters=all", "--out=/tmp/x"])
def test_options_corral_sets_itself_are_refused(arg):
    refused({"slurm": {"sbatch_args": [arg]}}, "cannot be passed through")


@pytest.mark.parametrize("arg", ["--exclusive --output=/tmp/x", "--comment='a b'", "--x\n#SBATCH --output=y", "x"])
def test_pass_through_options_are_one_word(arg):
    refused({"slurm": {"sbatch_args": [arg]}}, "sbatch option")


def test_script_writer_refuses_a_value_that_ends_its_line_even_past_the_model():
    spec = SlurmJobSpec(token="0123456789ab", task_ids=("c-1",), cluster="alpine", partition="gpu", num_nodes=1,
                        gres=None, gpus_per_node=0, cpus_per_node=None, memory_mb=None, envs={}, setup=None,
                        run="true", account="x\ntouch /tmp/p")
    with pytest.raises(UnsafeScriptValueError):
        sbatch_options(spec)
    with pytest.raises(UnsafeScriptValueError):
        render_sbatch(spec)


@pytest.mark.parametrize(("data", "fragment"), [
    ({"name": "a\nb"}, "name"),
    ({"name": "x" * 201}, "at most 200"),
    ({"workdir": "a\nb"}, "workdir"),
    ({"file_mounts": {"a\nb": "."}}, "file_mounts remote path"),
    ({"checkpoint": {"path": "/x\n/y"}}, "checkpoint path"),
    ({"envs": {"CORRAL_TASK_ID": "x"}}, "Corral's own variables"),
    ({"envs": {"A": "x\x00y"}}, "NUL"),
    ({"run": "echo \x00"}, "NUL"),
    ({"resources": {"infra": "slurm/al pine"}}, "not a cluster or partition name"),
    ({"resources": {"infra": "slurm/alpine/g\npu"}}, "not a cluster or partition name"),
    ({"resources": {"infra": "slurm/alpine\n/gpu"}}, "not a cluster or partition name"),
    ({"envs": {"A": "1"}, "secrets": {"A": "2"}}, "in both envs and secrets"),
])
def test_lines_names_and_paths(data, fragment):
    refused(data, fragment)


def test_env_values_arrive_byte_for_byte_whatever_they_hold():
    task = parse_task({"envs": {"A": "x'\n$(touch /tmp/p)`id`"}}, "t")
    assert job_environment(task, "t") == {"A": "x'\n$(touch /tmp/p)`id`"}


def test_secrets_are_env_values_left_out_of_the_stored_task(monkeypatch):
    monkeypatch.setenv("HF_TOKEN", "from-env")
    task = parse_task({"envs": {"A": "1"}, "secrets": {"WANDB_KEY": None}}, "t")
    task = apply_overrides(task, "t", secrets=["WANDB_KEY=s3cr3t", "HF_TOKEN"])
    assert job_environment(task, "t") == {"A": "1", "WANDB_KEY": "s3cr3t", "HF_TOKEN": "from-env"}
    stored = redacted_json(task)
    assert "s3cr3t" not in stored and "from-env" not in stored and '"WANDB_KEY": null' in stored
    with pytest.raises(TaskError, match="--secret 'MISSING': MISSING is not set in your environment"):
        apply_overrides(task, "t", secrets=["MISSING"])
    with pytest.raises(TaskError, match="secrets X must be given a value"):
        job_environment(parse_task({"secrets": {"X": None}}, "t"), "t")


def bounded(seconds: float, megabytes: float):
    """Run the body under a wall-clock and a memory (Python allocations) bound."""
    class Bound:
        def __enter__(self):
            tracemalloc.start()
            self.started = time.monotonic()

        def __exit__(self, *exc):
            elapsed = time.monotonic() - self.started
            _, peak = tracemalloc.get_traced_memory()
            tracemalloc.stop()
            assert elapsed < seconds, f"took {elapsed:.1f}s"
            assert peak < megabytes * 2**20, f"peaked at {peak / 2**20:.0f} MB"
    return Bound()


def test_a_huge_task_file_is_refused_without_being_read(tmp_path):
    path = tmp_path / "big.yaml"
    with open(path, "wb") as f:
        f.write(b"run: |\n")
        chunk = b"  echo " + b"x" * 1000 + b"\n"
        for _ in range(50 * 1024):  # ~50 MB
            f.write(chunk)
    with bounded(seconds=2, megabytes=8), pytest.raises(TaskError, match="larger than 1024 KiB"):
        load_task(path)
    assert path.stat().st_size > 40 * MAX_TASK_FILE_BYTES


def test_an_alias_bomb_is_refused(tmp_path):
    lines = ['a0: &a0 ["x","x","x","x","x","x","x","x","x"]']
    for i in range(1, 10):
        lines.append(f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]")
    text = "\n".join(lines) + "\nrun: *a9\n"
    with bounded(seconds=2, megabytes=64), pytest.raises(TaskError, match=f"more than {MAX_YAML_NODES} values"):
        load_task(write(tmp_path, text))


def test_deep_nesting_is_refused(tmp_path):
    for text in ("run: " + "[" * 5000 + "]" * 5000 + "\n", "run: " + "{a: " * 200 + "1" + "}" * 200 + "\n"):
        with bounded(seconds=2, megabytes=64), pytest.raises(TaskError, match="nested deeper|invalid YAML"):
            load_task(write(tmp_path, text))


def test_an_any_of_bomb_is_refused(tmp_path):
    alternatives = [{"accelerators": [f"GPU{i}:{n}" for n in range(1, 20)]} for i in range(50)]
    with bounded(seconds=2, megabytes=64), pytest.raises(TaskError, match="alternatives .* at most 64"):
        parse_task({"resources": {"any_of": alternatives}}, "t")
    nested = {"any_of": [{"any_of": [{"accelerators": "H100:1"}]}]}
    with bounded(seconds=2, megabytes=64), pytest.raises(TaskError, match="one level of alternatives"):
        parse_task({"resources": nested}, "t")


@pytest.mark.parametrize(("content", "fragment"), [
    (b"run: \xff\xfe echo\n", "not UTF-8 text (byte 5)"),
    (b"run: [unclosed\n", "invalid YAML"),
    (b"- just\n- a list\n", "must be a mapping"),
    (b"a: 1\n---\nb: 2\n", "holds 2 YAML documents, a pipeline (or a job group) of tasks"),
])
def test_unreadable_task_files_get_one_line(tmp_path, content, fragment):
    with pytest.raises(TaskError) as err:
        load_task(write(tmp_path, content))
    assert fragment in str(err.value) and "\n" not in str(err.value)


def test_a_directory_is_not_a_task_file(tmp_path):
    with pytest.raises(TaskError, match="is a directory"):
        load_task(tmp_path)
