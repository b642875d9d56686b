"""What Corral sends to Slurm: golden files for the batch script, and byte-exact quoting through bash."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.infra.slurm.jobscript import SlurmJobSpec, job_files, render_sbatch, submit_script, write_files_script
from tests.conftest import FIXTURES

GOLDEN = FIXTURES / "golden"


def spec(**overrides) -> SlurmJobSpec:
    base = dict(
        token="0123456789ab", task_ids=("c-deadbeef",), cluster="borealis", partition="h100-cluster",
        num_nodes=2, gres="gpu:H100:8", gpus_per_node=8, cpus_per_node=16, memory_mb=65536,
        envs={"LR": "0.001"}, setup="pip list", run="python train.py", time="2-00:00:00", account="research",
        qos="high", constraint="ib", reservation=None, sbatch_args=("--exclusive",),
    )
    base.update(overrides)
    return SlurmJobSpec(**base)


def check_golden(name: str, text: str) -> None:
    path = GOLDEN / name
    if os.environ.get("CORRAL_UPDATE_GOLDEN"):
        path.write_text(text)
    assert text == path.read_text(), f"{name} changed; review it and rerun with CORRAL_UPDATE_GOLDEN=1"


def test_sbatch_multi_node_gpu_job():
    check_golden("multinode.sbatch", render_sbatch(spec()))


def test_sbatch_cpu_job_without_options():
    check_golden("cpu.sbatch", render_sbatch(spec(num_nodes=1, gres=None, gpus_per_node=0, cpus_per_node=None,
                                                 memory_mb=None, time=None, account=None, qos=None,
                                                 constraint=None, sbatch_args=(), partition="cpu")))


def test_sbatch_job_array():
    check_golden("array.sbatch", render_sbatch(spec(task_ids=("c-1", "c-2", "c-3"), first_rank=3, num_jobs=6,
                                                   num_nodes=1)))


def run_bash(script: str, home: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(["bash", "-s"], input=script, capture_output=True, text=True,
                          env={"HOME": str(home), "PATH": os.environ["PATH"]})


awkward_text = st.text(
    alphabet=st.characters(blacklist_categories=("Cs",), blacklist_characters="\x00"), max_size=60
)


@settings(max_examples=200, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(files=st.dictionaries(st.sampled_from(["setup.sh", "run.sh", "a b", "it's"]), awkward_text, min_size=1))
def test_files_arrive_byte_for_byte(tmp_path, files):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    result = run_bash(write_files_script(".corral/runs/x y", files), home)
    assert result.returncode == 0, result.stderr
    for name, content in files.items():
        assert (home / ".corral/runs/x y" / name).read_bytes().decode() == content


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(values=st.dictionaries(st.from_regex(r"V[A-Z0-9_]{0,8}", fullmatch=True), awkward_text, max_size=4))
def test_env_values_arrive_byte_for_byte(tmp_path, values):
    home = tmp_path / "home"
    home.mkdir(exist_ok=True)
    env_sh = job_files(spec(envs=values))["env.sh"]
    names = " ".join(values) or "NONE"
    script = env_sh + f'for n in {names}; do printf "%s\\0" "${{!n-}}"; done\n'
    result = subprocess.run(["bash", "-c", script], capture_output=True, env={"PATH": os.environ["PATH"]})
    assert result.returncode == 0, result.stderr
    got = result.stdout.split(b"\0")[:-1]
    assert [g.decode() for g in got] == (list(values.values()) or [""])


def test_submit_script_skips_a_job_that_already_exists():
    script = submit_script(spec())
    assert "squeue -h --me -t all --name=corral-0123456789ab -o %A" in script
    assert script.index("existing") < script.index("sbatch --parsable")


@pytest.mark.parametrize("bad", ["1;rm -rf /", "$(id)", "12 13"])
def test_job_ids_are_validated_before_reaching_a_shell(bad):
    from corral.infra.slurm.jobs import cancel_script, follow_script, status_script

    for make in (lambda: cancel_script([bad]), lambda: status_script([bad]), lambda: follow_script("x", bad, True)):
        with pytest.raises(ValueError, match="not a Slurm job id"):
            make()


def test_cancel_leaves_each_job_its_marker_before_scancel():
    from corral.infra.slurm.jobs import cancel_script

    script = cancel_script(["41", "42_3"], [".corral/runs/a", ".corral/runs/b c"])
    lines = script.splitlines()
    assert lines[0] == '[ -d "$HOME"/.corral/runs/a ] && : > "$HOME"/.corral/runs/a/cancelled'
    assert lines[1] == """[ -d "$HOME"/'.corral/runs/b c' ] && : > "$HOME"/'.corral/runs/b c'/cancelled.3"""
    assert lines[2].startswith("scancel 41 42_3 ")
    assert cancel_script(["41"]).startswith("scancel 41 ")  # without run dirs: scancel alone


@pytest.mark.parametrize("bad", ["", ".corral/runs", ".corral/runs/../x", ".corral/runs/0123456789ab/..",
                                 "/etc/0123456789ab", ".corral/runs/0123456789AB", ".corral/runs/0123456789ab\n"])
def test_only_corrals_own_run_directories_reach_the_removal_of_env_files(bad):
    from corral.infra.slurm.jobs import remove_env_script

    assert remove_env_script([".corral/runs/0123456789ab", ".corral/runs/abcdef012345"]) == (
        'cd "$HOME" && rm -f -- .corral/runs/0123456789ab/env.sh .corral/runs/abcdef012345/env.sh\n')
    assert remove_env_script([]) == "exit 0\n"
    with pytest.raises(ValueError, match="not a Corral run directory"):
        remove_env_script([".corral/runs/0123456789ab", bad])


@pytest.mark.parametrize("bad", ["", "c-", "c-0123456789a", "c-0123456789ab/..", "../c-0123456789ab", "*",
                                 "c-0123456789AB", "c-0123456789ab\n"])
def test_only_job_ids_reach_the_removal_of_a_job_groups_host_files(bad):
    from corral.infra.shell import GROUPS_DIR, remove_group_dirs_script
    from corral.infra.slurm.jobscript import TASK_SH

    assert remove_group_dirs_script(["c-0123456789ab", "c-abcdef012345"]) == (
        'cd "$HOME" && rm -rf -- .corral/groups/c-0123456789ab .corral/groups/c-abcdef012345\n')
    assert f'"$HOME/{GROUPS_DIR}/$CORRAL_PIPELINE_ID' in TASK_SH  # where the task writes them
    with pytest.raises(ValueError, match="not a job group's id"):
        remove_group_dirs_script(["c-0123456789ab", bad])


def test_an_image_with_pyxis_runs_the_step_in_it():
    pyxis = spec(container_image="nvcr.io/nvidia/pytorch:24.01-py3", container_runtime="pyxis")
    check_golden("container-pyxis.sbatch", render_sbatch(pyxis))
    assert "container.sh" not in job_files(pyxis)
    assert "--container-image=ubuntu:22.04 " in render_sbatch(spec(container_image="ubuntu:22.04",
                                                                   container_runtime="pyxis"))


def test_an_image_with_apptainer_wraps_setup_and_run():
    files = job_files(spec(container_image="ubuntu:22.04", container_runtime="apptainer"))
    check_golden("container-apptainer.sh", files["container.sh"])
    assert files["job.sbatch"] == render_sbatch(spec())  # the batch script is the host's, as without an image
    assert "--nv" not in job_files(spec(container_image="ubuntu:22.04", container_runtime="singularity",
                                        gpus_per_node=0, gres=None))["container.sh"]


def test_an_image_reference_that_could_break_the_script_is_refused():
    from corral.infra.slurm.jobscript import UnsafeScriptValueError

    for image in ("ubuntu:22.04; rm -rf ~", "a b", "$(id)", "'x'"):
        with pytest.raises(UnsafeScriptValueError):
            job_files(spec(container_image=image, container_runtime="apptainer"))


def test_a_private_registrys_login_reaches_the_runtime_byte_for_byte(tmp_path):
    from corral.infra.slurm.jobscript import render_env

    files = job_files(spec(container_image="registry.example.com/team/img:1", container_runtime="apptainer"))
    (tmp_path / "container.sh").write_text(files["container.sh"])
    login = {"SKYPILOT_DOCKER_USERNAME": "robot$team", "SKYPILOT_DOCKER_PASSWORD": "p'a\"ss $(id)\\n\tx"}
    (tmp_path / "env.sh").write_text(render_env({**login, "PATH": "/nowhere"}))
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "apptainer").write_text('#!/bin/bash\nprintf "%s\\0%s\\0%s\\0" "$APPTAINER_DOCKER_USERNAME" '
                                       '"$APPTAINER_DOCKER_PASSWORD" "$*"\n')
    (bin_dir / "apptainer").chmod(0o755)
    env = {"CORRAL_RUN_DIR": str(tmp_path), "HOME": str(tmp_path), "PATH": f"{bin_dir}:/usr/bin:/bin"}
    out = subprocess.run(["bash", str(tmp_path / "container.sh"), "bash", "-c", "true"], env=env, cwd=tmp_path,
                         capture_output=True, timeout=30)
    user, password, argv, _ = out.stdout.decode().split("\0")
    assert (user, password) == (login["SKYPILOT_DOCKER_USERNAME"], login["SKYPILOT_DOCKER_PASSWORD"])
    assert argv.endswith("docker://registry.example.com/team/img:1 bash -c true")
    (tmp_path / "env.sh").write_text(render_env({"OTHER": "x"}))  # no login: none passed on
    out = subprocess.run(["bash", str(tmp_path / "container.sh"), "true"], env=env, cwd=tmp_path, capture_output=True)
    assert out.stdout.decode().split("\0")[:2] == ["", ""]
