"""The API's JSON for engine objects (plans, submissions, jobs, a pending job's explanation): built in
the server, rendered by the CLI (`cli/render.py`) and returned by `corral.sdk` as they are."""

from __future__ import annotations

import math
import time
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any

from corral.infra.base import JobState
from corral.timefmt import clock, minutes, start_text

if TYPE_CHECKING:
    from corral.controller.rules import ControllerSettings
    from corral.launch import Submitted
    from corral.managed import ManagedView
    from corral.placement import Candidate, Plan
    from corral.state.store import JobView, Store


def plan_json(plan: Plan) -> list[dict[str, object]]:
    """Every candidate, best first (`chosen` marks where the task goes), then the unreachable clusters."""
    ranked = plan.ranked()
    chosen = next((c for c in ranked if c.feasible), None)
    rows: list[dict[str, object]] = [
        {
            "cluster": c.cluster,
            "partition": c.partition,
            "infra": c.infra,
            "resources": c.option.describe(),
            "feasible": c.feasible,
            "reason": c.reason,
            "accelerators": str(c.option.accelerator) if c.option.accelerator else None,
            "gres": c.gres,
            "free_gpus": c.free_gpus,
            "can_start_now": c.startable_now,
            "predicted_start": c.predicted_start,
            "prediction": c.prediction_note,
            "pressure": round(c.pressure, 3),
            "chosen": c is chosen,
            # what it would run with there: the cluster's profile under the task (profiles.py)
            "runs_with": c.runs_with.to_json() if c.runs_with else None,
            "runs_with_text": c.runs_with.describe() if c.runs_with else "",
        }
        for c in ranked
    ]
    rows += [{"cluster": cluster, "partition": None, "infra": plan.place_infra(cluster), "feasible": False, "reason": error,
              "free_gpus": 0, "predicted_start": None, "chosen": False, "unreachable": True}
             for cluster, error in plan.unreachable.items()]
    return rows


def handle_fields(handle: str | None) -> dict[str, str | None]:
    """An answer's handle (where a job, attempt or allocation runs: a Slurm id, a pool's lab1/<token>, a
    Kubernetes Job's name) as `handle`, and as `slurm_job_id`, its older name, for scripts written before."""
    return {"handle": handle, "slurm_job_id": handle}


def submitted_json(s: Submitted) -> dict[str, object]:
    """One share of a launch (one job, or one array of a sweep's jobs) and what was skipped first."""
    return {"job_id": s.job_ids[0], "job_ids": s.job_ids, "cluster": s.cluster, "partition": s.partition,
            "infra": s.infra or infra_name("slurm", s.cluster, s.partition), **handle_fields(s.handle),
            "skipped": [{"infra": i, "reason": r} for i, r in s.tries],
            "handles": s.handles, "log_path": s.log_path}


def place_kinds() -> dict[str, str]:
    """Each place's kind by name (slurm, ssh, k8s), from the cluster file and config.yaml (small files,
    read now)."""
    from corral.config import load_registry
    from corral.errors import CorralError

    try:
        registry = load_registry()
    except CorralError:
        return {}
    return {name: registry.infra_kind(name) for name in registry.names()}


def infra_name(kind: str, cluster: str, partition: str | None) -> str:
    """How a place is written: slurm/<cluster>/<partition>; a pool (one place, named as itself) ssh/<pool>."""
    if kind != "slurm":
        return f"{kind}/{cluster}"
    return f"slurm/{cluster}/{partition}" if partition else f"slurm/{cluster}"


def place_name(cluster: str, partition: str | None, kinds: Mapping[str, str] | None = None) -> str:
    """A place as infra_name writes it, of the kind `kinds` (place_kinds()) gives it; Slurm where not given."""
    return infra_name((kinds or {}).get(cluster, "slurm"), cluster, partition)


def job_json(view: JobView, kinds: Mapping[str, str] | None = None) -> dict[str, object]:
    """`kinds`: each place's kind (slurm, ssh) by name; Slurm where not given."""
    a = view.attempt
    return {
        "job_id": view.job.id, "name": view.job.name, "owner": view.job.owner, "cluster": a.cluster, "partition": a.partition,
        "infra": place_name(a.cluster, a.partition, kinds) if a.cluster else None,
        **handle_fields(a.handle), "state": a.state, "reason": a.reason, "attempt": a.number,
        "submitted_at": a.submitted_at, "started_at": a.started_at, "ended_at": a.ended_at,
        "expected_start": a.expected_start if a.state == JobState.PENDING else None,
        "exit_code": a.exit_code, "job_rank": view.job.job_rank, "sweep_id": view.job.sweep_id,
        "allocation": view.job.allocation,  # the dev allocation an exec ran in (`corral exec`)
        "stderr_path": a.error_path,  # a script's --error file apart from its log (`corral logs --stderr`)
    }


def sweeps_named_by_first_job(store: Store, named: list[tuple[str, list[Any]]], scope: str | None,
                              managed_only: bool = False) -> dict[str, dict[str, object]]:
    """For a cancel: of the references that named one job, each that is the first of a sweep of several
    by its id (not the sweep's name, which cancels them all), that sweep's size and its name when the
    name means this sweep alone (store.sweep_named), by job id. The id the queue's sweep row shows is
    its first job's, so cancelling it cancels that job only, and the answer says how to cancel the rest."""
    first = {views[0].job.id: views[0].job for ref, views in named
             if len(views) == 1 and views[0].job.sweep_id == views[0].job.id and ref != views[0].job.name}
    notes: dict[str, dict[str, object]] = {}
    for job_id, size in store.sweep_sizes(set(first)).items():
        name = first[job_id].name
        if size > 1:
            alone = bool(name) and job_id in store.sweep_named(name, managed_only, scope)
            notes[job_id] = {"name": name if alone else None, "jobs": size}
    return notes


def candidate_start(c: Candidate) -> str:
    return start_text(can_start_now=c.startable_now, predicted_start=c.predicted_start,
                      prediction=c.prediction_note, feasible=c.feasible)


def explain_pending(view: ManagedView, plan: Plan, settings: ControllerSettings) -> list[str]:
    """Why a pending managed job waits where it is, as lines of text: its Slurm reason, the start
    there and on the best alternative, and why the controller has not moved it."""
    latest = view.latest
    assert latest is not None
    now = time.time()
    here = next((c for c in plan.candidates if (c.cluster, c.partition) == (latest.cluster, latest.partition)), None)
    others = [c for c in plan.feasible() if (c.cluster, c.partition) != (latest.cluster, latest.partition)]
    best = min(others, key=lambda c: c.predicted_start if c.predicted_start is not None else math.inf, default=None)
    reason = latest.reason or "waiting for the scheduler"
    where = here.infra if here is not None else infra_name("slurm", latest.cluster, latest.partition)
    lines = [f"{view.job.id} is pending on {where}: {reason}"]
    here_start = latest.expected_start or (here.predicted_start if here else None)
    source = "Slurm's estimate for this job" if latest.expected_start else "predicted by sbatch --test-only"
    lines.append(f"  start there: {_at(here_start, now)} ({source})" if here_start else
                 f"  start there: {candidate_start(here) if here else 'unknown'}")
    if best is None:
        return lines + ["  no other cluster can run it"]
    lines.append(f"  best alternative: {best.infra}, start {candidate_start(best)}")
    if view.managed.pipeline_parallel:
        why = (f"it is a task of job group {view.managed.pipeline_name}, which runs on one cluster: its tasks "
               "stay where the others can reach them")
    elif here is not None and here.startable_now:
        why = "its own cluster can start it now"
    elif best.startable_now:
        why = (f"it will move on the controller's next tick (pending ≥ {settings.reroute_after:g}s, "
               f"no move in the last {settings.reroute_cooldown:g}s)")
    elif here_start is None or best.predicted_start is None:
        why = "no start time is known for both, so there is nothing to compare"
    else:
        gain, needed = here_start - best.predicted_start, settings.margin(here_start, now)
        if gain < needed:
            sooner = f"only {minutes(gain)} sooner" if gain > 0 else "not sooner"
            why = (f"the alternative is {sooner}; a move needs "
                   f"{minutes(needed)} (at least {settings.reroute_margin:g}s and "
                   f"{settings.reroute_margin_fraction:.0%} of the wait)")
        else:
            why = (f"it will move: {minutes(gain)} sooner is more than the {minutes(needed)} margin "
                   f"(predictions are refreshed every {settings.predict_interval:g}s)")
    return lines + [f"  not moved because: {why}"]


def _at(epoch: float, now: float) -> str:
    return f"{clock(epoch)} (in {minutes(epoch - now)})"
