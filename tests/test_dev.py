"""Which tasks a live dev allocation runs: what a task asks for against what the allocation holds
(`dev.unmet`), and how many of its GPUs an exec takes (`dev.gpus_to_claim`), pure, on rows as
`launch -c` records them."""

from __future__ import annotations

import json

from corral.dev import OutputLines, gpus_to_claim, resources_key, unmet
from corral.state.models import AllocationRow
from corral.task import parse_task
from corral.taskfile import parse_yaml


def task(text: str):
    return parse_task(parse_yaml(text, "task.yaml"), "task.yaml")


def held(text: str, *, gres: str | None = "gpu:h100:2", gpus: int = 2, nodes: int = 2,
         handle: str | None = None) -> AllocationRow:
    key = json.loads(resources_key(task(text)))
    return AllocationRow(name="dev", token="t", cluster="borealis", partition="h100-cluster", num_nodes=nodes,
                         handle=handle, accelerator=gres, gpus_per_node=gpus, resources=json.dumps(key), run_dir="r",
                         created_at=0.0)


def test_a_task_asking_for_less_than_is_held_runs_in_it():
    row = held("resources:\n  accelerators: H100:2\n  cpus: 8\n  memory: 64\n  infra: slurm/borealis\n")
    for asks in ("run: x\n",  # nothing at all
                 "resources:\n  accelerators: H100:1\n",
                 "resources:\n  accelerators: h100\n  cpus: 4+\n  memory: 64\n",
                 "resources:\n  infra: slurm\n", "resources:\n  infra: slurm/borealis/h100-cluster\n",
                 "resources:\n  accelerators: [H100:4, H100:2]\n"):  # one alternative that fits is enough
        assert unmet(row, "slurm", task(asks)) is None, asks


def test_a_task_asking_for_more_or_elsewhere_says_what_and_what_is_held():
    row = held("resources:\n  accelerators: H100:2\n  cpus: 8\n")
    cases = {
        "resources:\n  accelerators: H100:4\n": "H100:4 (it holds 2 GPUs (h100) per node)",
        "resources:\n  accelerators: L40S:1\n": "L40S:1 (it holds 2 GPUs (h100) per node)",
        "resources:\n  cpus: 16\n": "cpus=16 (it holds 8)",
        "resources:\n  memory: 32+\n": "memory=32+GB (it was held without a number of memory, and has not said "
                                       "what it got)",
        "resources:\n  infra: slurm/alpine\n": "infra slurm/alpine (it is on slurm/borealis/h100-cluster)",
        "resources:\n  infra: slurm/borealis/l40s\n": "infra slurm/borealis/l40s (it is on slurm/borealis/h100-cluster)",
        "resources:\n  infra: ssh/lab\n": "infra ssh/lab (it is on slurm/borealis/h100-cluster)",
    }
    for asks, said in cases.items():
        assert unmet(row, "slurm", task(asks)) == said, asks
    no_gpu = held("resources:\n  cpus: 1\n", gres=None, gpus=0)
    assert unmet(no_gpu, "slurm", task("resources:\n  accelerators: H100:1\n")) == "H100:1 (it holds no GPU)"


def test_an_exec_takes_the_gpus_its_task_names_and_none_when_it_names_none():
    row = held("resources:\n  accelerators: H100:2\n  cpus: 8\n")
    cases = {
        "run: x\n": 0,  # it names none: it sees all of them, and takes none
        "resources:\n  cpus: 4\n": 0,
        "resources:\n  accelerators: H100:1\n": 1,
        "resources:\n  accelerators: h100:2\n": 2,
        "resources:\n  accelerators: [H100:4, H100:2, H100:1]\n": 2,  # the first alternative that fits
        "resources:\n  any_of:\n    - infra: slurm/alpine\n      accelerators: H100:1\n    - cpus: 2\n": 0,
    }
    for asks, taken in cases.items():
        assert gpus_to_claim(row, "slurm", task(asks)) == taken, asks
    no_gpu = held("resources:\n  cpus: 1\n", gres=None, gpus=0)
    assert gpus_to_claim(no_gpu, "slurm", task("resources:\n  cpus: 1\n")) == 0


def test_corrals_own_lines_in_an_execs_output_are_read_across_chunks_and_only_at_a_line_start():
    def read(*chunks: bytes) -> list[bytes]:
        passed: list[bytes] = []
        lines: list[bytes] = []
        sink = OutputLines(b"corral: ", lines.append, passed.append)
        for chunk in chunks:
            sink(chunk)
        assert passed == list(chunks)  # every chunk goes on, as it came
        return lines

    assert read(b"corral: setup failed with exit code 5\n") == [b"corral: setup failed with exit code 5"]
    assert read(b"installing\ncorral: set", b"up fai", b"led on h1\n", b"corral: waiting for 1") == [
        b"corral: setup failed on h1"]  # a line is read once whole
    assert read(b"echo 'corral: setup failed' is text\n", b"x corral: setup failed\n") == []
    assert read(b"x" * 5000, b"corral: not at a line start\n", b"corral: this is\n") == [b"corral: this is"]


def test_cpus_and_memory_held_without_a_number_count_as_what_the_infra_gave():
    row = held("resources:\n  accelerators: H100:2\n")
    row.held_cpus, row.held_memory_mb = 4, 16384  # as its holder read SLURM_CPUS_ON_NODE and its memory
    for asks in ("resources:\n  cpus: 4\n", "resources:\n  cpus: 2+\n  memory: 16\n"):
        assert unmet(row, "slurm", task(asks)) is None, asks
    assert unmet(row, "slurm", task("resources:\n  cpus: 8\n")) == (
        "cpus=8 (it was held without a number of cpus; the infra gave it 4 per node)")
    assert unmet(row, "slurm", task("resources:\n  memory: 32\n")) == (
        "memory=32GB (it was held without a number of memory; the infra gave it 16GB per node)")


def test_a_queued_exec_whose_allocation_went_or_changed_fails_and_none_starts(tmp_path):
    """An exec queued until its allocation is ready must never start in another allocation that took
    the name (another holder job), nor wait for one that is gone; no cluster is asked for them."""
    import asyncio
    import time

    from corral.dev import start_queued_execs
    from corral.infra.base import JobState
    from corral.state import Store
    from corral.state.models import AttemptRow, JobRow

    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    now = time.time()
    store.put_allocation(held("run: x\n", handle="8"))  # `dev` again, as another Slurm job
    jobs = [JobRow(id=job_id, name="exec", task_json="{}", created_at=now, allocation=name)
            for job_id, name in (("c-1", "dev"), ("c-2", "gone"))]
    attempts = [AttemptRow(token=f"exec-{job.id}", job_id=job.id, number=1, cluster="borealis", partition="p",
                           handle="7", state=JobState.PENDING, created_at=now, run_dir="r", log_path="r/o")
                for job in jobs]
    store.add_jobs(jobs, attempts)
    started: list[object] = []
    waiting = asyncio.run(start_queued_execs(client=None, store=store, spawn=started.append))  # type: ignore[arg-type]
    assert waiting == 0
    assert started == [] and store.queued_execs() == []
    ended = {v.job.id: (v.attempt.state, v.attempt.reason) for v in store.views(["c-1", "c-2"])}
    assert ended == {job: (JobState.FAILED, "its allocation ended before it was ready") for job in ("c-1", "c-2")}

