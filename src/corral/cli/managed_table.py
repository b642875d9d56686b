"""`corral jobs queue` as a table, from the managed jobs' JSON (the store's or the controller API's),
so that the command needs neither the engine nor the database when the controller answers."""

from __future__ import annotations

import time
from collections.abc import Mapping

from corral.cli.common import handle_header, handle_in, place_of
from corral.cli.consoles import console, minutes, state_cell
from corral.cli.consoles import table as new_table
from corral.timefmt import duration, when


def render_managed(jobs: list[Mapping[str, object]]) -> None:
    if not jobs:
        console.print("No managed jobs.")
        return
    table = new_table(("ID", "NAME", "STATE", "INFRA", handle_header(jobs), "SUBMITTED", "DURATION", "ATTEMPTS",
                       "STARTS", "REASON"))
    now = time.time()
    for job in pipelines_in_order(jobs):
        state = str(job["state"])
        expected = job.get("expected_start")
        starts = f"in {minutes(expected - now)}" if isinstance(expected, (int, float)) and expected > now else "-"
        place = job.get("pipeline")
        name = f"{place['name']}/{place['task']}: {job['name']}" if isinstance(place, Mapping) else str(job["name"])
        ran = _number(job.get("run_seconds"))
        table.add_row(str(job["job_id"]), name, state_cell(state),
                      _where(job),
                      str(handle_in(job) or "-"), when(_number(job.get("created_at"))),
                      duration(ran) if ran is not None else "-", str(job["attempts"]), starts,
                      str(job.get("reason") or "")[:90])
    console.print(table)


def _where(job: Mapping[str, object]) -> str:
    """Its latest attempt's place as `queue` writes it: alpine/gpu for Slurm, ssh/lab, k8s/ctx."""
    return place_of(job).removeprefix("slurm/") if job.get("cluster") else "-"


def pipelines_in_order(jobs: list[Mapping[str, object]]) -> list[Mapping[str, object]]:
    """The jobs as given (newest first), but a pipeline's tasks together, in the order they run, where
    the first of them shown is."""
    groups: dict[object, list[Mapping[str, object]]] = {}
    for job in jobs:
        place = job.get("pipeline")
        groups.setdefault(place["id"] if isinstance(place, Mapping) else job["job_id"], []).append(job)
    return [job for group in groups.values()
            for job in sorted(group, key=lambda j: j["pipeline"]["task"] if j.get("pipeline") else 0)]


def _number(value: object) -> float | None:
    return float(value) if isinstance(value, (int, float)) else None
