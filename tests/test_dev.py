"""Which tasks a live dev allocation runs: what a task asks for against what the allocation holds
(`dev.unmet`), and how many of its GPUs an exec takes (`dev.gpus_to_claim`), pure, on rows as
`launch -c` records them."""

from __future__ import annotations

import json

from corral.dev import OutputLines, gpus_to_claim, resources_key, unmet
from corral.infra.base import AllocationPhase, AllocationState, HoldsAllocations
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


def test_an_exec_runs_in_the_allocations_image_and_a_task_naming_another_is_refused():
    in_image = held("resources:\n  image_id: docker:ubuntu:22.04\n  cpus: 1\n", gres=None, gpus=0)
    for asks in ("run: x\n", "resources:\n  image_id: docker:ubuntu:22.04\n"):
        assert unmet(in_image, "slurm", task(asks)) is None, asks
    assert unmet(in_image, "slurm", task("resources:\n  image_id: docker:python:3.12\n")) == (
        "image_id docker:python:3.12 (it runs in docker:ubuntu:22.04)")
    on_hosts = held("resources:\n  cpus: 1\n", gres=None, gpus=0)
    assert unmet(on_hosts, "slurm", task("resources:\n  image_id: docker:ubuntu:22.04\n")) == (
        "image_id docker:ubuntu:22.04 (it runs on its hosts, in no image)")
    # an allocation recorded before images were: its key has none, and it ran on its hosts
    recorded = held("resources:\n  cpus: 1\n", gres=None, gpus=0)
    recorded.resources = json.dumps({k: v for k, v in json.loads(recorded.resources).items() if k != "image_id"})
    assert unmet(recorded, "slurm", task("run: x\n")) is None
    assert unmet(recorded, "slurm", task("resources:\n  image_id: docker:ubuntu:22.04\n")).startswith("image_id")


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



class _Holders(HoldsAllocations):
    """A cluster's allocations as `allocation_states` reports them, counting its round trips."""

    def __init__(self, states: dict[str, AllocationState]):
        self.states, self.asked = states, []

    async def allocation_states(self, held):
        self.asked.append(sorted(handle for handle, _ in held))
        return {handle: self.states[handle] for handle, _ in held}


_Holders.__abstractmethods__ = frozenset()  # only what the engine's queued-exec pass uses


class _Client:
    def __init__(self, holders: _Holders):
        self.holders = holders

    def infra(self, cluster: str, owner: str = "") -> _Holders:
        return self.holders


def test_queued_execs_start_once_their_allocation_is_ready_at_one_status_query_per_cluster(tmp_path):
    """The engine's pass: none asked without queued execs; then one query for both allocations of the
    cluster; the ready one's execs are started (unless cancelled first), the pending one's wait, its
    reason and Slurm's estimate kept on them."""
    import asyncio
    import time

    from corral.dev import start_queued_execs
    from corral.infra.base import JobState
    from corral.state import Store
    from corral.state.models import AttemptRow, JobRow

    store = Store(f"sqlite:///{tmp_path / 'state.db'}")
    holders = _Holders({"7": AllocationState(AllocationPhase.READY, None, ["b1"], None, "59:00"),
                        "8": AllocationState(AllocationPhase.PENDING, "Resources", [], None, "1:00:00",
                                             expected_start=1796015347.0)})
    started: list[object] = []

    def tick() -> int:
        return asyncio.run(start_queued_execs(_Client(holders), store, started.append))  # type: ignore[arg-type]

    assert tick() == 0 and holders.asked == []
    now = time.time()
    for name, handle in (("dev", "7"), ("later", "8")):
        row = held("run: x\n", handle=handle)
        row.name = name
        store.put_allocation(row)
    jobs = [JobRow(id=job_id, name="exec", task_json="{}", created_at=now, allocation=name)
            for job_id, name in (("c-1", "dev"), ("c-2", "dev"), ("c-3", "dev"), ("c-4", "later"))]
    store.add_jobs(jobs, [AttemptRow(token=f"exec-{j.id}", job_id=j.id, number=1, cluster="borealis", partition="p",
                                     handle="7" if j.allocation == "dev" else "8", state=JobState.PENDING,
                                     created_at=now, run_dir="r", log_path="r/o") for j in jobs])
    store.move_attempt("exec-c-3", JobState.PENDING, state=JobState.CANCELLED)  # `corral cancel` came first
    assert tick() == 1 and holders.asked == [["7", "8"]]
    for coroutine in started:
        coroutine.close()  # type: ignore[attr-defined]
    assert len(started) == 2
    views = {v.job.id: v.attempt for v in store.views(["c-1", "c-2", "c-3", "c-4"])}
    assert [views[j].state for j in ("c-1", "c-2", "c-3", "c-4")] == [
        JobState.RUNNING, JobState.RUNNING, JobState.CANCELLED, JobState.PENDING]
    assert views["c-1"].submitted_at is not None and views["c-4"].submitted_at is None
    assert (views["c-4"].reason, views["c-4"].expected_start) == (
        "waiting for its allocation later to be ready (PENDING: Resources)", 1796015347.0)
    assert store.queued_execs() == ["c-4"]
    # The 30 s settling pass asks about execs sent to their allocation only: not c-4's allocation again.
    assert sorted(job_id for job_id, _, _ in store.live_execs()) == ["c-1", "c-2"]
