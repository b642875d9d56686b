"""A pool machine's claims and queue (claims.py, runner.py): the real scripts, run by bash in a scratch
home with two A100s and two L4s from the pool's config and three cores (`OMP_NUM_THREADS`, which nproc
honours). Tasks wait for a file the test writes, so the test says when each ends. The same scripts on
the testbed's machines, over ssh: tests/cli/test_pools.py."""

from __future__ import annotations

import os
import signal
import subprocess
from pathlib import Path

import pytest

from corral.infra.base import JobRequest
from corral.infra.sshpool import runner
from corral.infra.sshpool.inventory import Gpu, inventory_script, parse_inventory
from tests.conftest import wait_for

GPUS = ["NVIDIA A100", "NVIDIA A100", "NVIDIA L4", "NVIDIA L4"]
HOG = "python3 -c 'import time; b = bytearray(160 * 2**20); time.sleep(600)'"  # 160 MB resident (zeroed)


class Machine:
    def __init__(self, home: Path):
        self.home = home
        self.env = {**os.environ, "HOME": str(home), "OMP_NUM_THREADS": "3"}
        self.host = self.run("hostname").strip()

    def run(self, script: str) -> str:
        return subprocess.run(["bash", "-c", script], env=self.env, capture_output=True, text=True, timeout=60).stdout

    def submit(self, n: int, gpus: int = 0, kind: str | None = None, cpus: int | None = None,
               may_queue: bool = True, memory_mb: int | None = None, time_limit: int | None = None,
               run: str = "") -> str:
        request = JobRequest(token=token(n), task_ids=(f"c-{n}",), place="lab", num_nodes=1, accelerator_type=kind,
                             accelerators_per_node=gpus, cpus_per_node=cpus, memory_mb=memory_mb, envs={}, setup=None,
                             run=run + f'echo "gpus=$CUDA_VISIBLE_DEVICES"; until [ -e "$HOME/end-{n}" ]; '
                             "do sleep 0.05; done", time_limit_seconds=time_limit)
        files = {"job.sh": runner.job_script(request, "lab"), "env.sh": "", "setup.sh": "", "run.sh": request.run or ""}
        answer = self.run(runner.submit_script(request, "lab", files, GPUS, may_queue=may_queue)).strip()
        return answer.split("/", 1)[1] if "/" in answer else answer

    def end(self, n: int) -> None:
        (self.home / f"end-{n}").touch()

    def states(self, *numbers: int) -> dict[int, str]:
        lines = self.run(runner.status_script([token(n) for n in numbers])).splitlines()
        found = {line.split()[0]: line.split()[1:3] for line in lines if not line.startswith("@@")}  # no type
        return {n: " ".join(found[token(n)]).replace(" -", "") for n in numbers}

    def log(self, n: int) -> str:
        path = self.home / ".corral/runs" / token(n) / "log.txt"
        return path.read_text() if path.exists() else ""


def token(n: int) -> str:
    return f"{n:012x}"


@pytest.fixture
def machine(tmp_path):
    made = Machine(tmp_path)
    yield made
    for path in (tmp_path / ".corral/runs").glob("*/pid"):  # tasks left waiting for their file
        pid = int(path.read_text().split()[0])
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def test_a_retry_on_another_machine_of_a_shared_home_names_the_machine_that_took_it(machine):
    """A submission whose answer was lost, tried again on the next machine: with one home, that machine
    finds the task's run dir and must name the first, where the task runs, not itself."""
    assert machine.submit(3, 1, "NVIDIA A100") == f"{token(3)} new"
    machine.env["HOSTNAME"] = "lab-other"
    answer = machine.run(runner.submit_script(
        JobRequest(token=token(3), task_ids=("c-3",), place="lab", num_nodes=1, accelerator_type="NVIDIA A100",
                   accelerators_per_node=1, cpus_per_node=None, memory_mb=None, envs={}, setup=None, run="true"),
        "lab", {"job.sh": "", "run.sh": "true"}, GPUS)).strip()
    assert answer == f"@@corral submitted {machine.host}/{token(3)} existing"


def test_a_task_that_must_wait_is_queued_and_starts_when_the_gpus_it_waits_for_free_up(machine):
    assert machine.submit(1, 2, "NVIDIA A100") == f"{token(1)} new"
    assert machine.submit(2, 1, "NVIDIA A100") == f"{token(2)} queued"
    assert machine.submit(2, 1, "NVIDIA A100") == f"{token(2)} existing"  # a retried submission
    assert machine.states(1, 2) == {1: "running", 2: "queued 0:1:0:0"}
    assert wait_for("task 1's output", lambda: machine.log(1)) == "gpus=0,1\n"
    machine.end(1)  # its exit trap starts the next, with no status poll
    assert wait_for("task 2's output", lambda: machine.log(2)) == "gpus=0\n"
    assert machine.states(1, 2) == {1: "ended 0", 2: "running"}


def test_a_waiting_task_holds_back_later_ones_of_its_kind_but_not_others(machine):
    assert machine.submit(1, 2, "NVIDIA A100").endswith("new")
    assert machine.submit(2, 2, "NVIDIA A100").endswith("queued")  # waits for both A100s
    assert machine.submit(3, 1, "NVIDIA L4").endswith("new")  # another kind passes it
    assert machine.submit(4, 0, None).endswith("new")  # a CPU task (one core) passes it
    assert machine.submit(5, 1, None).endswith("queued")  # any GPU: an A100 is what 2 waits for
    assert machine.states(2, 5) == {2: "queued 0:2:0:0", 5: "queued 1:1:0:0"}
    machine.end(1)
    assert wait_for("task 2's output", lambda: machine.log(2)) == "gpus=0,1\n"
    assert wait_for("task 5's output", lambda: machine.log(5)) == "gpus=3\n"  # nothing holds it back now


def test_cpu_tasks_hold_their_cores_and_wait_for_them(machine):
    assert machine.submit(1, cpus=2).endswith("new")
    assert machine.submit(2, cpus=2).endswith("queued")  # 1 of 3 cores free
    assert machine.submit(3).endswith("queued")  # one core would fit, but 2 was first
    assert machine.submit(4, 1, "NVIDIA L4").endswith("new")  # a GPU task holds no core
    assert machine.submit(5, cpus=4).endswith("rejected vm has 3 CPU(s), not 4".replace("vm", machine.host))  # never fits
    inventory = parse_inventory("lab1", machine.run(inventory_script()),
                                tuple(Gpu(i, name, None, None) for i, name in enumerate(GPUS)))
    assert inventory.cpus == 3 and inventory.cpus_claimed == 2 and len(inventory.gpus) == 4
    assert [(w.gpus, w.cpus) for w in inventory.queued] == [(0, 2), (0, 1)]
    assert inventory.held == {2: token(4)}  # the first L4
    machine.end(1)
    wait_for("tasks 2 and 3 to start", lambda: machine.states(2, 3) == {2: "running", 3: "running"})


def test_a_queued_task_that_is_cancelled_never_starts_and_lets_the_next_go(machine):
    assert machine.submit(1, 2, "NVIDIA A100").endswith("new")
    assert machine.submit(2, 2, "NVIDIA A100").endswith("queued")
    assert machine.submit(3, 1, "NVIDIA A100").endswith("queued")
    machine.run(runner.cancel_script([token(2)]))
    assert machine.states(2, 3) == {2: "cancelled", 3: "queued 0:1:0:0"}
    assert not (machine.home / ".corral/runs" / token(2) / "pid").exists()
    machine.end(1)
    assert wait_for("task 3's output", lambda: machine.log(3)) == "gpus=0\n"


def test_without_a_queue_a_busy_machine_refuses_and_keeps_nothing(machine):
    host = machine.host
    assert machine.submit(1, 1, "NVIDIA A100").endswith("new")
    assert machine.submit(2, 2, "NVIDIA A100", may_queue=False) == (
        f"@@corral rejected {host} has 1 free GPU(s) of the kind asked, not 2")
    assert not (machine.home / ".corral/runs" / token(2)).exists()
    assert machine.submit(3, 2, "NVIDIA A100").endswith("queued")
    # one A100 is free, but task 3 waits for it: a task that may not wait is refused, and says why
    assert machine.submit(4, 1, "NVIDIA A100", may_queue=False) == (
        f"@@corral rejected {host} has tasks queued before it")
    assert not (machine.home / ".corral/runs" / token(4)).exists()
    assert machine.states(3) == {3: "queued 0:2:0:0"}


def test_a_task_killed_outright_frees_its_gpus_at_the_next_status_poll(machine):
    assert machine.submit(1, 2, "NVIDIA A100").endswith("new")
    assert machine.submit(2, 2, "NVIDIA A100").endswith("queued")
    pid = int((machine.home / ".corral/runs" / token(1) / "pid").read_text().split()[0])
    os.killpg(pid, signal.SIGKILL)  # no exit trap runs
    wait_for("task 1 to be gone", lambda: machine.states(1)[1] == "vanished")
    assert wait_for("task 2's output", lambda: machine.log(2)) == "gpus=0,1\n"


def test_others_lists_the_runs_no_handle_names_so_a_lost_answer_is_found(machine):
    """A submission whose answer never came back (Corral holds no handle for it): the status of no
    handle, with `others`, reports it running, and a queued one waiting, and a multi-node task's rank
    with its task's count of ranks; not runs that ended long ago, nor a rank that does not say its count,
    nor another machine's run in a shared home, and what was asked by handle once."""
    assert machine.submit(1, 4) == f"{token(1)} new"
    assert machine.submit(2, 4) == f"{token(2)} queued"
    assert machine.submit(3, 0, cpus=1) == f"{token(3)} new"
    machine.end(3)
    wait_for("task 3 to end", lambda: machine.states(3) == {3: "ended 0"})
    old = machine.home / ".corral/runs" / token(4)  # a run of yesterday, ended
    (old / "exit_code").parent.mkdir(parents=True)
    (old / "exit_code").write_text("0\n")
    os.utime(old, (0, 0))
    (machine.home / ".corral/runs" / f"{token(5)}.1").mkdir()  # a rank's, from before ranks said their count
    rank = machine.home / ".corral/runs" / f"{token(7)}.1"  # rank 1 of 2, running here
    rank.mkdir()
    for name, text in (("host", f"{machine.host}\n"), ("nodes", "2\n"),
                       ("pid", (machine.home / ".corral/runs" / token(1) / "pid").read_text())):
        (rank / name).write_text(text)
    other = machine.home / ".corral/runs" / token(6)  # another machine's run, in a home they share
    other.mkdir()
    (other / "host").write_text("gpu7\n")
    (other / "pid").write_text((machine.home / ".corral/runs" / token(1) / "pid").read_text())  # alive, seen here

    def listed(*asked: int, others: bool = True) -> list[str]:
        lines = machine.run(runner.status_script([token(n) for n in asked], others)).splitlines()
        return sorted(" ".join(line.split()[:2]) for line in lines if not line.startswith("@@"))

    assert listed() == [f"{token(1)} running", f"{token(2)} queued", f"{token(3)} ended", f"{token(7)}.1 running"]
    said = machine.run(runner.status_script([], True)).splitlines()
    assert f"@@corral ranks {token(7)}.1 2" in said  # how many ranks its task has: the pool adopts whole tasks only
    # It succeeds though the last run it looks at is another machine's (ssh reports a failed script as
    # the machine's failure, and that machine's runs would go unseen).
    status = subprocess.run(["bash", "-c", runner.status_script([], True)], env=machine.env, capture_output=True)
    assert status.returncode == 0, status.stderr
    assert listed(1) == listed()  # asked by its handle: one line for it, as before
    assert listed(1, others=False) == [f"{token(1)} running"]


def test_memory_is_claimed_and_a_task_waits_for_it(machine):
    """A task that asks memory claims that much of the machine's MemTotal while it lives; one that would
    not fit waits (holding back later tasks that ask memory, not those that ask none) and starts when
    the memory is freed; one that asks more than the machine has is refused."""
    total = int(machine.run("grep MemTotal: /proc/meminfo").split()[1]) // 1024
    assert machine.submit(1, memory_mb=total - 1000) == f"{token(1)} new"
    assert machine.submit(2, memory_mb=2000) == f"{token(2)} queued"
    assert machine.submit(3, memory_mb=10) == f"{token(3)} queued"  # fits, but 2 waits for memory first
    assert machine.submit(4) == f"{token(4)} new"  # asks none: passes them
    refused = machine.submit(5, memory_mb=total + 1)
    assert refused == f"@@corral rejected {machine.host} has {total} MB of memory, not {total + 1}"
    assert machine.states(2, 3) == {2: "queued 0:0:1:2000", 3: "queued 1:0:1:10"}
    inventory = parse_inventory("lab1", machine.run(inventory_script()), ())
    assert inventory.memory_claimed_mb == total - 1000 and inventory.cpus_claimed == 2
    assert [(w.memory_mb, w.cpus) for w in inventory.queued] == [(2000, 1), (10, 1)]
    machine.end(1)  # its exit trap frees the memory: both start
    wait_for("tasks 2 and 3 to start", lambda: machine.states(2, 3) == {2: "running", 3: "running"})
    inventory = parse_inventory("lab1", machine.run(inventory_script()), ())
    assert inventory.memory_claimed_mb == 2010 and inventory.queued == ()


def test_a_task_past_its_walltime_is_ended_and_what_waited_for_its_gpus_starts(machine):
    """Counted from the start, not the queue: task 2 waits behind 1, then has its own 3 s."""
    assert machine.submit(1, 2, "NVIDIA A100", time_limit=2, run="trap 'echo got TERM; exit 5' TERM; ").endswith("new")
    assert machine.submit(2, 2, "NVIDIA A100", time_limit=3).endswith("queued")
    assert machine.submit(3, 1, "NVIDIA L4", time_limit=60).endswith("new")
    assert wait_for("task 1's walltime", lambda: machine.states(1)[1] == "timeout", timeout=20)
    assert "the task reached its time limit" in machine.log(1) and "got TERM" in machine.log(1)
    assert wait_for("task 2 to start on the freed GPUs", lambda: machine.states(2)[2] == "running", timeout=10)
    assert machine.states(3) == {3: "running"}  # its own limit is far off
    assert wait_for("task 2's walltime", lambda: machine.states(2)[2] == "timeout", timeout=20)
    machine.end(3)
    assert wait_for("task 3 to end", lambda: machine.states(3)[3] == "ended 0")
    # Each watchdog ends with its task, and one that ended in time was never marked.
    assert wait_for("the watchdogs to end", lambda: subprocess.run(
        ["pgrep", "-f", f"corral-walltime .*{machine.home}"], capture_output=True).returncode != 0, timeout=15)
    assert not (machine.home / ".corral/runs" / token(3) / "timed_out").exists()


def test_a_cancelled_task_is_not_called_timed_out(machine):
    assert machine.submit(1, 1, "NVIDIA L4", time_limit=2).endswith("new")
    wait_for("task 1 to run", lambda: machine.states(1)[1] == "running")
    machine.run(runner.cancel_script([token(1)]))
    assert wait_for("task 1 to be cancelled", lambda: machine.states(1)[1] == "cancelled")
    assert wait_for("its watchdog to end", lambda: subprocess.run(
        ["pgrep", "-f", f"corral-walltime .*{machine.home}"], capture_output=True).returncode != 0, timeout=15)
    assert machine.states(1) == {1: "cancelled"} and "time limit" not in machine.log(1)


def test_a_machine_without_the_runtime_refuses_an_image_and_keeps_nothing(machine):
    """The pool offers a runtime only where every machine had it at the probe; one that lost it since
    (here: none on the PATH) refuses, as it refuses a task its GPUs cannot hold."""
    request = JobRequest(token=token(1), task_ids=("c-1",), place="lab", num_nodes=1, accelerator_type=None,
                         accelerators_per_node=0, cpus_per_node=None, memory_mb=None, envs={}, setup=None,
                         run="true", container_image="ubuntu:22.04", container_runtime="apptainer")
    files = {"job.sh": runner.job_script(request, "lab"), "env.sh": "", "setup.sh": "", "run.sh": "true"}
    answer = machine.run(runner.submit_script(request, "lab", files, GPUS)).strip()
    assert answer == f"@@corral rejected {machine.host} has no apptainer to run the image"
    assert not (machine.home / ".corral/runs" / token(1)).exists()


def test_a_task_using_more_memory_than_it_asked_for_is_ended_and_says_so(machine):
    """As Slurm's OverMemoryKill: its watchdog reads the task's resident memory every 10 s; past the
    limit it ends the task (TERM, then KILL) and leaves what it used for the status. A task within its
    limit, and one that asks none, are left alone."""
    hog = f"{HOG} & "
    assert machine.submit(4, memory_mb=100, run=hog) == f"{token(4)} new"
    assert machine.submit(5, memory_mb=400, run=hog) == f"{token(5)} new"
    state = wait_for("the memory watchdog", lambda: (s := machine.states(4)[4]).startswith("out_of_memory") and s,
                     timeout=40)
    used, limit = state.split()[1].split(":")
    assert int(used) >= 160 and limit == "100", state
    assert "corral: *** the task used " in machine.log(4) and "more than the 100 MB it asked for on " in machine.log(4)
    assert machine.states(5)[5] == "running"
    machine.end(5)
    assert wait_for("task 5's end", lambda: machine.states(5)[5] == "ended 0")
    assert not (machine.home / ".corral/runs" / token(5) / "out_of_memory").exists()
