"""The pool's status pieces that need no machine: a multi-node task made whole, or found in part."""

from __future__ import annotations

from corral.infra.base import JobState
from corral.infra.sshpool.pool import NOT_FOUND, _whole_tasks
from tests.fakes import status


def ranks_of(token: str, found: dict[int, str], count: int, state: JobState = JobState.RUNNING):
    """The pool's view of a task's ranks no handle names: (machine, rank token) -> status, and each rank
    token's machine and task size (its `@@corral ranks` line)."""
    unnamed = {(host, f"{token}.{r}"): status(f"{host}/{token}.{r}", f"{token}.{r}", state)
               for r, host in found.items()}
    nodes = {f"{token}.{r}": (host, count) for r, host in found.items()}
    return unnamed, nodes


def test_a_task_whose_every_rank_is_found_is_one_status_its_handle_naming_the_machines_in_rank_order():
    unnamed, nodes = ranks_of("tok1", {1: "lab3", 0: "lab2"}, 2)
    [task] = _whole_tasks(unnamed, nodes)
    assert (task.handle, task.token, task.state, task.partial) == ("lab2,lab3/tok1", "tok1", JobState.RUNNING, False)


def test_a_task_found_in_part_is_partial_its_handle_marking_the_ranks_not_found():
    """What a server killed half-way through starting the ranks leaves: cancellable, never adopted."""
    unnamed, nodes = ranks_of("tok2", {0: "lab1", 2: "lab4"}, 3)
    [task] = _whole_tasks(unnamed, nodes)
    assert task.handle == f"lab1,{NOT_FOUND},lab4/tok2" and task.token == "tok2" and task.partial


def test_ranks_that_disagree_on_their_tasks_size_or_lie_beyond_it_are_no_task():
    unnamed, nodes = ranks_of("tok3", {0: "lab1", 1: "lab2"}, 2)
    nodes["tok3.1"] = ("lab2", 3)
    assert _whole_tasks(unnamed, nodes) == []
    unnamed, nodes = ranks_of("tok4", {0: "lab1", 5: "lab2"}, 2)
    assert _whole_tasks(unnamed, nodes) == []
