from pathlib import Path

import pytest

from corral.task import TaskError, apply_overrides, load_task, parse_task, resolved_envs, resource_options, task_json_schema


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "task.yaml"
    path.write_text(text)
    return path


def test_skypilot_style_task_file(tmp_path):
    task = load_task(write(tmp_path, """
name: train
workdir: .
num_nodes: 2
resources:
  accelerators: {H100: 8}
  cpus: 16+
  memory: 64
  infra: slurm/borealis
envs:
  LR: 0.001
  DEBUG: true
file_mounts:
  /data/ckpt: ./ckpt
setup: pip list
run: python train.py
"""))
    assert task.num_nodes == 2 and task.name == "train"
    [option] = resource_options(task.resources)
    assert str(option.accelerator) == "H100:8" and str(option.cpus) == "16+" and str(option.memory_gb) == "64"
    assert option.infra.cluster == "borealis"
    assert resolved_envs(task, "t") == {"LR": "0.001", "DEBUG": "true"}


@pytest.mark.parametrize(("yaml_text", "message"), [
    ("resources:\n  acelerators: H100:8\n", "resources.acelerators: unknown field; did you mean 'accelerators'?"),
    ("runn: echo\n", "runn: unknown field; did you mean 'run'?"),
    ("resources:\n  accelerators: H100:x\n", "invalid accelerator 'H100:x'"),
    ("resources:\n  accelerators: H100:0\n", "the count must be at least 1"),
    ("num_nodes: 0\n", "num_nodes: Input should be greater than or equal to 1"),
    ("num_nodes: two\n", "num_nodes: Input should be a valid integer"),
    ("resources:\n  infra: aws/us-east-1\n", "every alternative is on infra Corral does not run (aws/us-east-1)"),
    ("resources:\n  infra: slrum/alpine\n", "every alternative is on infra Corral does not run (slrum/alpine)"),
    ("resources:\n  use_spt: true\n", "resources.use_spt: unknown field; did you mean 'use_spot'?"),
    ("resources:\n  autostop: {idle_minuts: 5}\n", "resources.autostop.idle_minuts: unknown field; did you mean"),
    ("resources:\n  autostop: soon\n", "invalid autostop 'soon'"),
    ("resources:\n  job_recovery: sometimes\n", "unknown strategy 'sometimes'"),
    ("resources:\n  job_recovery: {stratgy: FAILOVER}\n", "stratgy: unknown field; did you mean 'strategy'?"),
    ("resources:\n  memory: 64XB\n", "invalid memory '64XB'"),
    ("resources:\n  region: alpine\n", "region and zone need cloud"),
    ("resources:\n  cloud: slurm\n  infra: slurm\n", "either infra or cloud/region/zone"),
    ("file_mounts:\n  /data: gs://bucket/path\n", "gs:// object storage (SkyPilot's; not through this client) is not supported"),
    ("file_mounts:\n  /data: {sorce: ./d}\n", "'/data'.sorce: unknown field; did you mean 'source'?"),
    ("file_mounts:\n  /data: {name: v, store: volume}\n", "volumes are a cloud's disks"),
    ("file_mounts:\n  /data: {source: ./d, mode: LINK}\n", "use MOUNT, COPY or MOUNT_CACHED"),
    ("resources:\n  memory: lots\n", "invalid memory 'lots'"),
    ("slurm:\n  time: forever\n", "invalid time 'forever'"),
    ("slurm:\n  sbatch_args: [exclusive]\n", "must start with '-'"),
    ("envs:\n  1BAD: x\n", "invalid environment variable name '1BAD'"),
    ("resources:\n  image_id: 'docker:bad image'\n", "invalid image_id"),
    ("resources:\n  any_of: [{accelerators: H100}]\n  ordered: [{accelerators: A100}]\n", "either any_of or ordered"),
    ("- just\n- a list\n", "must be a mapping"),
])
def test_bad_task_files_name_file_field_and_fix(tmp_path, yaml_text, message):
    path = write(tmp_path, yaml_text)
    with pytest.raises(TaskError) as err:
        load_task(path)
    assert str(err.value).startswith(f"{path}: ")
    assert message in str(err.value)


def test_malformed_yaml_gives_line_and_column(tmp_path):
    path = write(tmp_path, "name: x\nresources:\n  accelerators: [H100\n")
    with pytest.raises(TaskError, match=rf"^{path}:4:1: invalid YAML"):
        load_task(path)


def test_missing_file(tmp_path):
    with pytest.raises(TaskError, match="task file not found"):
        load_task(tmp_path / "nope.yaml")


def test_accelerator_forms_and_alternatives():
    # SkyPilot's list is tried in order; its set ({A: 1, B: 1} in YAML flow style: keys without values) as equals
    assert [(str(o.accelerator), o.preference) for o in resource_options(parse_task(
        {"resources": {"accelerators": ["H100:8", "A100:8"]}}, "t").resources)] == [("H100:8", 0), ("A100:8", 1)]
    assert [(str(o.accelerator), o.preference) for o in resource_options(parse_task(
        {"resources": {"accelerators": {"H100:8": None, "A100:8": None}}}, "t").resources)] == \
        [("H100:8", 0), ("A100:8", 0)]
    ordered = resource_options(parse_task({"resources": {"cpus": 4, "ordered": [
        {"accelerators": "H100:1", "infra": "slurm/borealis"}, {"accelerators": "L4"}]}}, "t").resources)
    assert [(str(o.accelerator), str(o.infra), o.preference, str(o.cpus)) for o in ordered] == [
        ("H100:1", "slurm/borealis", 0, "4"), ("L4:1", "", 64, "4")]  # ordered first, then list order; "": any kind
    any_of = resource_options(parse_task({"resources": {"any_of": [{"accelerators": "H100"},
                                                                   {"accelerators": "B300"}]}}, "t").resources)
    assert {o.preference for o in any_of} == {0}


def test_null_env_must_come_from_the_command_line():
    task = parse_task({"envs": {"HF_TOKEN": None}, "run": "echo"}, "t.yaml")
    with pytest.raises(TaskError, match="t.yaml: envs HF_TOKEN must be given a value: pass --env HF_TOKEN="):
        resolved_envs(task, "t.yaml")
    given = apply_overrides(task, "t.yaml", envs=["HF_TOKEN=abc=d"])
    assert resolved_envs(given, "t.yaml") == {"HF_TOKEN": "abc=d"}


def test_overrides_are_validated_like_the_file():
    task = parse_task({"resources": {"accelerators": "H100:8"}}, "t.yaml")
    changed = apply_overrides(task, "t.yaml", gpus="L4:1", infra="slurm/alpine/inference", num_nodes=2,
                              cpus="4+", memory="16", name="x")
    [option] = resource_options(changed.resources)
    assert (str(option.accelerator), str(option.infra), changed.num_nodes, changed.name) == (
        "L4:1", "slurm/alpine/inference", 2, "x")
    with pytest.raises(TaskError, match="num_nodes"):
        apply_overrides(task, "t.yaml", num_nodes=0)
    with pytest.raises(TaskError, match="expected KEY=VALUE"):
        apply_overrides(task, "t.yaml", envs=["NOVALUE"])


def test_json_schema_documents_fields():
    schema = task_json_schema()
    assert {"name", "workdir", "num_nodes", "resources", "envs", "file_mounts", "setup", "run", "slurm"} <= set(
        schema["properties"])
    assert schema["additionalProperties"] is False
    assert "description" in schema["$defs"]["Resources"]["properties"]["accelerators"]
