"""A waiting task's move to another machine of its pool (moves.py): the real scripts, run by bash in
scratch homes, as tests/infra/sshpool/test_claims.py runs the queue's. Machines apart have a home each
(the pool copies the run dir between them: here a plain copy); machines that share a home are told apart
by HOSTNAME, as the testbed's are. The pool's own decisions (which task, which machine) are tested
without bash at the end; the whole move on the testbed's machines in tests/cli/test_pools.py."""

from __future__ import annotations

import os
import shutil
import signal
from pathlib import Path

import pytest

from corral.config import PoolEntry
from corral.infra.sshpool import moves, runner
from corral.infra.sshpool.inventory import Gpu, Inventory, Wants
from corral.infra.sshpool.pool import SshPoolInfra
from tests.conftest import wait_for
from tests.infra.sshpool.test_claims import GPUS, Machine, token


def _machine(home: Path, name: str | None = None) -> Machine:
    made = Machine(home)
    if name is not None:
        made.env["HOSTNAME"] = made.host = name
    return made


@pytest.fixture
def homes(tmp_path):
    yield tmp_path
    for path in tmp_path.glob("**/.corral/runs/*/pid"):
        try:
            os.killpg(int(path.read_text().split()[0]), signal.SIGKILL)
        except ProcessLookupError:
            pass


def _answer(machine: Machine, script: str) -> str:
    return next(line for line in machine.run(script).splitlines() if line.startswith("@@corral ")).split(" ", 1)[1]


def _queue(machine: Machine) -> list[str]:
    folder = machine.home / ".corral/pool" / machine.host / "queue"
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


def test_a_waiting_task_moves_to_a_machine_with_a_home_of_its_own_and_keeps_its_files(homes):
    first, second = _machine(homes / "a"), _machine(homes / "b")
    assert first.submit(1, 2, "NVIDIA A100").endswith("new")
    assert first.submit(2, 2, "NVIDIA A100").endswith("queued")
    [entry] = _queue(first)
    assert _answer(first, moves.withdraw_script(token(2), "gpu2")) == f"withdrawn {entry}"
    assert _queue(first) == [] and first.states(2) == {2: "moving gpu2"}
    shutil.copytree(first.home / ".corral/runs" / token(2), second.home / ".corral/runs" / token(2))
    assert _answer(second, moves.take_script(token(2), entry, GPUS)) == f"submitted {second.host}/{token(2)} new"
    assert wait_for("its output on the second machine", lambda: second.log(2)) == "gpus=0,1\n"
    assert _answer(second, moves.take_script(token(2), entry, GPUS)).endswith("existing")  # a retried take
    assert _answer(first, moves.settle_script(token(2), True, GPUS)) == "settled"
    assert not (first.home / ".corral/runs" / token(2)).exists()  # its copy (env.sh with it) is gone
    assert second.states(2) == {2: "running"}
    second.end(2)
    assert wait_for("it to end", lambda: second.states(2) == {2: "ended 0"})


def test_a_move_the_target_refuses_puts_the_task_back_where_it_was_in_its_queue(homes):
    first, second = _machine(homes / "a"), _machine(homes / "b")
    assert first.submit(1, 2, "NVIDIA A100").endswith("new")
    assert first.submit(2, 2, "NVIDIA A100").endswith("queued")
    assert first.submit(3, 1, "NVIDIA A100").endswith("queued")
    before = _queue(first)
    entry = before[0]
    assert _answer(first, moves.withdraw_script(token(2), "gpu2")) == f"withdrawn {entry}"
    assert _answer(second, moves.take_script(token(2), entry, GPUS)).startswith("refused its files are not on")
    assert _answer(first, moves.settle_script(token(2), False, GPUS)) == "settled"
    assert _queue(first) == before  # its old entry: still first
    assert first.states(2, 3) == {2: "queued 0:2:0:0", 3: "queued 1:1:0:0"}
    first.end(1)
    assert wait_for("task 2's output where it waited", lambda: first.log(2)) == "gpus=0,1\n"


def test_only_a_task_that_still_waits_is_withdrawn(homes):
    machine = _machine(homes / "a")
    assert machine.submit(1, 2, "NVIDIA A100").endswith("new")
    assert _answer(machine, moves.withdraw_script(token(1), "gpu2")).startswith("stays")
    assert machine.submit(2, 2, "NVIDIA A100").endswith("queued")
    machine.run(runner.cancel_script([token(2)]))
    assert _answer(machine, moves.withdraw_script(token(2), "gpu2")).startswith("stays")
    assert machine.states(1) == {1: "running"}


def test_withdrawing_a_task_lets_a_later_one_its_size_held_back_start(homes):
    machine = _machine(homes / "a")
    assert machine.submit(1, 1, "NVIDIA A100").endswith("new")
    assert machine.submit(2, 2, "NVIDIA A100").endswith("queued")
    assert machine.submit(3, 1, "NVIDIA A100").endswith("queued")  # would fit, held back by 2
    assert _answer(machine, moves.withdraw_script(token(2), "gpu2")).startswith("withdrawn")
    assert wait_for("task 3's output", lambda: machine.log(3)) == "gpus=1\n"


def test_machines_that_share_a_home_hand_over_the_run_dir_and_name_its_new_machine(homes):
    lab1, lab2 = _machine(homes, "lab1"), _machine(homes, "lab2")
    assert lab1.submit(1, 2, "NVIDIA A100").endswith("new")
    assert lab1.submit(2, 2, "NVIDIA A100").endswith("queued")
    [entry] = _queue(lab1)
    assert _answer(lab1, moves.withdraw_script(token(2), "lab2")) == f"withdrawn {entry}"
    assert _answer(lab2, moves.take_script(token(2), entry, GPUS)) == f"submitted lab2/{token(2)} new"
    assert wait_for("its output", lambda: lab2.log(2)) == "gpus=0,1\n"
    assert lab1.states(2) == {2: "moved lab2"}  # a status asked of the machine it left names the new one
    assert _answer(lab1, moves.settle_script(token(2), True, GPUS)) == "settled"
    assert (lab1.home / ".corral/runs" / token(2) / "pid").exists()  # the shared dir is lab2's now
    assert _answer(lab1, runner.cancel_script([token(2)])) == f"moved {token(2)} lab2"  # cancel it there too
    lab2.run(runner.cancel_script([token(2)]))
    assert wait_for("it to end, cancelled", lambda: lab2.states(2)[2].startswith("cancelled"))


def test_a_cancel_that_reaches_the_copy_left_behind_is_named_when_the_move_settles(homes):
    first, second = _machine(homes / "a"), _machine(homes / "b")
    assert first.submit(1, 2, "NVIDIA A100").endswith("new")
    assert first.submit(2, 2, "NVIDIA A100").endswith("queued")
    entry = _answer(first, moves.withdraw_script(token(2), "gpu2")).split()[1]
    shutil.copytree(first.home / ".corral/runs" / token(2), second.home / ".corral/runs" / token(2))
    first.run(runner.cancel_script([token(2)]))  # the user's cancel, to the machine its handle still names
    assert _answer(second, moves.take_script(token(2), entry, GPUS)).endswith("new")
    assert _answer(first, moves.settle_script(token(2), True, GPUS)) == "settled cancelled"


# ---- the pool's choice, without bash --------------------------------------------------------------
def _inventory(name: str, held: int, queued: tuple[Wants, ...] = (), cpus: int = 8) -> Inventory:
    gpus = tuple(Gpu(i, "NVIDIA A100", None, None) for i in range(4))
    return Inventory(name, cpus, 64000, 64000, gpus, {i: "x" for i in range(held)}, "config", queued=queued)


def _pool(**inventories: Inventory) -> SshPoolInfra:
    pool = SshPoolInfra(PoolEntry("lab", tuple(inventories), ()), transport=None)  # type: ignore[arg-type]
    pool._inventories.update(inventories)
    return pool


A100 = "NVIDIA A100"


def test_a_waiting_task_goes_to_the_fullest_machine_that_can_start_it_now():
    pool = _pool(lab1=_inventory("lab1", 4), lab2=_inventory("lab2", 0), lab3=_inventory("lab3", 2))
    assert pool._moves([("lab1", token(1), 0, Wants(2, 0, A100))]) == [("lab1", token(1), "lab3")]
    # lab3's two free GPUs are booked by that move: the next task of two goes to lab2
    assert pool._moves([("lab1", token(2), 0, Wants(2, 0, A100))]) == [("lab1", token(2), "lab2")]


def test_a_task_stays_where_no_other_machine_can_start_it_or_one_waits_there_first():
    pool = _pool(lab1=_inventory("lab1", 4), lab2=_inventory("lab2", 2, queued=(Wants(1, 0, A100),)))
    assert pool._moves([("lab1", token(1), 0, Wants(1, 0, A100))]) == []  # lab2's own waiting task goes first
    assert pool._moves([("lab1", token(1), 0, Wants(4, 0, A100))]) == []
    # a CPU task passes lab2's waiting GPU task, as it would in lab2's queue
    assert pool._moves([("lab1", token(1), 0, Wants(0, 1, ""))]) == [("lab1", token(1), "lab2")]


def test_tasks_with_fewer_ahead_of_them_move_first():
    pool = _pool(lab1=_inventory("lab1", 4), lab2=_inventory("lab2", 2))
    waiting = [("lab1", token(2), 1, Wants(2, 0, A100)), ("lab1", token(1), 0, Wants(2, 0, A100))]
    assert pool._moves(waiting) == [("lab1", token(1), "lab2")]
