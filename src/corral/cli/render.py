"""Rich rendering of command results (tables on stdout, problems on stderr)."""

from __future__ import annotations

import math
import time
from typing import TYPE_CHECKING

from rich.table import Table

from corral.cli.consoles import console, err_console, minutes

if TYPE_CHECKING:  # type hints only: a table must not cost the import of the engine, SQLAlchemy or pydantic
    from collections.abc import Iterable

    from corral.controller.engine import ControllerSettings
    from corral.dev import AllocationStatus
    from corral.launch import LaunchEvents, Submitted
    from corral.managed import ManagedView
    from corral.placement import Candidate, Plan
    from corral.sdk.types import ClusterCheck, GpuReport, Job, QueuePage
    from corral.state.store import JobView



def render_check(checks: list[ClusterCheck]) -> None:
    table = Table(box=None, header_style="bold")
    for column in ("CLUSTER", "STATUS", "SLURM", "PARTITIONS", "GPU TYPES", "TIME"):
        table.add_column(column)
    for c in checks:
        if not c.ok:
            table.add_row(c.cluster, f"[red]FAIL[/red] ({c.error_kind})", "-", "-", "-", f"{c.seconds:.2f}s")
            continue
        partitions = ", ".join(p + ("*" if p == c.default_partition else "") for p in c.partitions)
        table.add_row(c.cluster, "[green]OK[/green]", c.slurm_version or "?", partitions,
                      ", ".join(c.gpu_types) or "-", f"{c.seconds:.2f}s")
    console.print(table)
    for c in checks:
        if c.error:
            err_console.print(f"[red]✗[/red] {c.error}", highlight=False)


def render_gpus(report: GpuReport, gpu: str | None) -> None:
    table = Table(box=None, header_style="bold")
    for column in ("CLUSTER", "PARTITION", "GPU", "GRES TYPE", "FREE", "TOTAL", "NODES", "PENDING"):
        table.add_column(column, justify="right" if column in ("FREE", "TOTAL", "NODES", "PENDING") else "left")
    for r in report.rows:
        free = f"[green]{r.free}[/green]" if r.free else "[dim]0[/dim]"
        table.add_row(r.cluster, r.partition, r.gpu, r.gres_type or "(untyped)", free, str(r.total),
                      str(r.nodes), str(r.pending))
    for f in report.failures:
        table.add_row(f.cluster, "[red]unavailable[/red]", "-", "-", "-", "-", "-", "-")
    if report.rows or report.failures:
        console.print(table)
    else:
        console.print(f"No GPUs{' matching ' + repr(gpu) if gpu else ''} on any cluster.")
    for f in report.failures:
        err_console.print(f"[red]✗[/red] {f.error_message}", highlight=False)


# ---- launch, queue --------------------------------------------------------------------------------

def _when(epoch: float | None) -> str:
    if epoch is None:
        return "-"
    return time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(epoch))


def _start(candidate: Candidate) -> str:
    if candidate.startable_now:
        return "now"
    if candidate.predicted_start is None:
        return (candidate.prediction_note or "-")[:60] if candidate.feasible else "-"
    delta = candidate.predicted_start - time.time()
    if delta > 86400 * 365:
        return "not foreseeable"
    return "now" if delta < 60 else f"in {_duration(delta)}"


def _duration(seconds: float) -> str:
    seconds = int(seconds)
    if seconds < 60:
        return f"{seconds}s"
    if seconds < 3600:
        return f"{seconds // 60}m"
    if seconds < 86400:
        return f"{seconds // 3600}h{(seconds % 3600) // 60:02d}m"
    return f"{seconds // 86400}d{(seconds % 86400) // 3600}h"


def plan_json(plan: Plan) -> list[dict[str, object]]:
    ranked = plan.ranked()
    chosen = next((c for c in ranked if c.feasible), None)
    rows: list[dict[str, object]] = [
        {
            "cluster": c.cluster,
            "partition": c.partition,
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
        }
        for c in ranked
    ]
    rows += [{"cluster": cluster, "partition": None, "feasible": False, "reason": error, "free_gpus": 0,
              "predicted_start": None, "chosen": False} for cluster, error in plan.unreachable.items()]
    return rows


def render_plan(plan: Plan, full: bool) -> None:
    ranked = plan.ranked()
    chosen = next((c for c in ranked if c.feasible), None)
    table = Table(box=None, header_style="bold")
    for column in ("", "INFRA", "RESOURCES", "FREE GPUS", "START", "WHY NOT"):
        table.add_column(column)
    shown = ranked if full else [c for c in ranked if c.feasible][:5]
    for c in shown:
        mark = "[green]→[/green]" if c is chosen else ""
        table.add_row(mark, c.infra, c.option.describe(), str(c.free_gpus) if c.feasible else "-",
                      _start(c), "" if c.feasible else f"[dim]{c.reason}[/dim]")
    for cluster, error in plan.unreachable.items():
        table.add_row("", f"slurm/{cluster}", "-", "-", "-", f"[red]{error}[/red]")
    target = console if full else err_console
    target.print(table)


class _LaunchPrinter:
    def plan(self, plan: Plan) -> None:
        render_plan(plan, full=False)

    def skipped(self, infra: str, why: str) -> None:
        err_console.print(f"[yellow]↷[/yellow] {infra} skipped: {why}", highlight=False)

    def submitted(self, submitted: Submitted) -> None:
        ids = ", ".join(submitted.job_ids[:3]) + (" …" if len(submitted.job_ids) > 3 else "")
        err_console.print(f"[green]✓[/green] {ids} submitted to slurm/{submitted.cluster}/{submitted.partition} "
                          f"as Slurm job {submitted.handle}", highlight=False)


def launch_events() -> LaunchEvents:
    from corral.launch import LaunchEvents

    printer = _LaunchPrinter()
    return LaunchEvents(plan=printer.plan, skipped=printer.skipped, submitted=printer.submitted)


def submitted_json(s: Submitted) -> dict[str, object]:
    return {"job_id": s.job_ids[0], "job_ids": s.job_ids, "cluster": s.cluster, "partition": s.partition,
            "slurm_job_id": s.handle, "skipped": [{"infra": i, "reason": r} for i, r in s.tries]}


def sweep_json(shares: list[Submitted]) -> list[dict[str, object]]:
    """One object per job of a sweep, with its array task's Slurm id."""
    out: list[dict[str, object]] = []
    for share in shares:
        for job_id, handle in zip(share.job_ids, share.handles):
            out.append({"job_id": job_id, "cluster": share.cluster, "partition": share.partition,
                        "slurm_job_id": handle})
    return out


def job_json(view: JobView) -> dict[str, object]:
    a = view.attempt
    return {
        "job_id": view.job.id, "name": view.job.name, "cluster": a.cluster, "partition": a.partition,
        "slurm_job_id": a.slurm_job_id, "state": a.state, "reason": a.reason, "attempt": a.number,
        "submitted_at": a.submitted_at, "started_at": a.started_at, "ended_at": a.ended_at,
        "expected_start": a.expected_start if a.state == "PENDING" else None,
        "exit_code": a.exit_code, "job_rank": view.job.job_rank, "sweep_id": view.job.sweep_id,
    }


_STATE_STYLE = {"RUNNING": "green", "PENDING": "yellow", "SUCCEEDED": "dim", "FAILED": "red",
                "CANCELLED": "dim", "SUBMIT_FAILED": "red", "LOST": "red"}
_QUEUE_COLUMNS = ("ID", "NAME", "INFRA", "SLURM ID", "STATE", "REASON", "SUBMITTED", "STARTED", "ENDED")


def _styled(state: str) -> str:
    style = _STATE_STYLE.get(state, "")
    return f"[{style}]{state}[/{style}]" if style else state


def _job_row(j: Job) -> tuple[str, ...]:
    where = f"{j.cluster}/{j.partition}" if j.cluster else "-"  # "-": it never reached a cluster
    return (j.job_id, j.name, where, j.slurm_job_id or "-", _styled(j.state),
            j.reason or "", _when(j.submitted_at), _when(j.started_at), _when(j.ended_at))


def _sweep_row(jobs: list[Job], counts: dict[str, int]) -> tuple[str, ...]:
    """One row for a whole sweep: its jobs per state (all of them, not only those on the page)."""
    first = jobs[0]
    places = sorted({f"{j.cluster}/{j.partition}" for j in jobs})
    total = sum(counts.values()) or len(jobs)
    states = ", ".join(f"{n} {_styled(state)}" for state, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    return (f"{first.sweep_id} (sweep)", f"{first.name} ×{total}",
            places[0] if len(places) == 1 else f"{len(places)} places", "-", states, "",
            _when(min((j.submitted_at or 0) for j in jobs) or None), "", "")


def queue_rows(page: QueuePage, expand: bool) -> list[tuple[str, ...]]:
    rows: list[tuple[str, ...]] = []
    seen: set[str] = set()
    for j in page.jobs:
        sweep = j.sweep_id
        if sweep and not expand:
            if sweep not in seen:
                seen.add(sweep)
                rows.append(_sweep_row([k for k in page.jobs if k.sweep_id == sweep], page.sweeps.get(sweep, {})))
            continue
        rows.append(_job_row(j))
    return rows


def render_queue(page: QueuePage, expand: bool = False) -> None:
    if not page.jobs:
        console.print("No jobs." if not page.more else "No jobs on this page.")
        return
    table = Table(box=None, header_style="bold")
    for column in _QUEUE_COLUMNS:
        table.add_column(column)
    for row in queue_rows(page, expand):
        table.add_row(*row)
    console.print(table)


def render_queue_stream(jobs: Iterable[Job], chunk: int = 500) -> None:
    """Every job, a table per chunk: output starts at once and memory stays flat."""
    batch: list[Job] = []
    first = True
    for job in jobs:
        batch.append(job)
        if len(batch) == chunk:
            _print_chunk(batch, first)
            batch, first = [], False
    if batch or first:
        _print_chunk(batch, first)


def _print_chunk(jobs: list[Job], header: bool) -> None:
    if not jobs:
        console.print("No jobs.")
        return
    table = Table(box=None, header_style="bold", show_header=header)
    for column in _QUEUE_COLUMNS:
        table.add_column(column)
    for j in jobs:
        table.add_row(*_job_row(j))
    console.print(table)


def stream_json(rows: Iterable[dict[str, object]]) -> None:
    """A JSON list written as it comes, one object per line."""
    import json
    import sys

    out = sys.stdout
    out.write("[")
    for i, row in enumerate(rows):
        out.write(("\n  " if i == 0 else ",\n  ") + json.dumps(row))
    out.write("\n]\n")
    out.flush()


def render_status(statuses: list[AllocationStatus]) -> None:
    if not statuses:
        console.print("No dev allocations. Create one with `corral launch -c NAME --gpus H100:1`.")
        return
    now = time.time()
    table = Table(box=None, header_style="bold")
    for column in ("NAME", "INFRA", "RESOURCES", "STATE", "AGE", "IDLE", "TIME LEFT", "NODES"):
        table.add_column(column)
    for st in statuses:
        r = st.row
        resources = f"{r.num_nodes}x {r.gres or 'cpu'}"
        state = st.state + (f" ({st.reason})" if st.reason else "")
        idle = _duration(now - st.last_active) if st.last_active and st.state == "READY" else "-"
        limit = f"/{_duration(r.idle_seconds)}" if r.idle_seconds else ""
        table.add_row(r.name, f"{r.cluster}/{r.partition}", resources, state, _duration(now - r.created_at),
                      idle + limit, st.time_left or "-", ",".join(st.nodes) or "-")
    console.print(table)


def explain_pending(view: ManagedView, plan: Plan, settings: ControllerSettings) -> None:
    latest = view.latest
    assert latest is not None
    now = time.time()
    here = next((c for c in plan.candidates if (c.cluster, c.partition) == (latest.cluster, latest.partition)), None)
    others = [c for c in plan.feasible() if (c.cluster, c.partition) != (latest.cluster, latest.partition)]
    best = min(others, key=lambda c: c.predicted_start if c.predicted_start is not None else math.inf, default=None)
    console.print(f"{view.job.id} is pending on slurm/{latest.cluster}/{latest.partition}: "
                  f"{latest.reason or 'waiting for the scheduler'}", highlight=False)
    here_start = latest.expected_start or (here.predicted_start if here else None)
    source = "Slurm's estimate for this job" if latest.expected_start else "predicted by sbatch --test-only"
    console.print(f"  start there: {_at(here_start, now)} ({source})" if here_start else
                  f"  start there: {_start(here) if here else 'unknown'}", highlight=False)
    if best is None:
        console.print("  no other cluster can run it", highlight=False)
        return
    console.print(f"  best alternative: {best.infra}, start {_start(best)}", highlight=False)
    if here is not None and here.startable_now:
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
    console.print(f"  not moved because: {why}", highlight=False)


def _at(epoch: float, now: float) -> str:
    return f"{time.strftime('%H:%M:%S', time.localtime(epoch))} (in {minutes(epoch - now)})"

