"""Rich rendering of command results (tables on stdout, problems on stderr)."""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Any

from rich.text import Text

from corral.cli.common import handle_header, handle_in, on_slurm, place_of, warn
from corral.cli.consoles import console, err_console, literal, state_cell, styled
from corral.cli.consoles import table as new_table
from corral.timefmt import duration, expected_start, start_text, when

if TYPE_CHECKING:  # type hints only: a table must not cost the import of the engine, SQLAlchemy or pydantic
    from collections.abc import Iterable

    from corral.sdk.types import ClusterCheck, GpuReport, Job, QueuePage



def render_check(checks: list[ClusterCheck]) -> None:
    table = new_table(("CLUSTER", "STATUS", "SLURM", "PARTITIONS", "GPU TYPES", "HOME", "CONTAINERS", "TIME"))
    for c in checks:
        kind = {"ssh": "(ssh pool)", "k8s": "(kubernetes)"}.get(str(c.raw.get("kind")))
        if not c.ok:
            failed = styled("FAIL", "red") + f" ({c.error_kind})"
            table.add_row(c.cluster, failed, kind or "-", "-", "-", "-", "-", f"{c.seconds:.2f}s")
            continue
        partitions = ", ".join(p + ("*" if p == c.default_partition else "") for p in c.partitions)
        fs = c.raw.get("home_filesystem")
        home = f"{fs} ({'shared' if c.raw.get('home_shared') else 'local'})" if fs else "?"
        version = kind or c.slurm_version or "?"
        table.add_row(c.cluster, styled("OK", "green"), version, partitions,
                      ", ".join(c.gpu_types) or "-", home, ", ".join(c.raw.get("container_runtimes") or []) or "-",
                      f"{c.seconds:.2f}s")
    console.print(table)
    for c in checks:
        if c.error:
            err_console.print(f"[red]✗[/red] {literal(c.error)}")
        for warning in c.warnings:  # the cluster answers, but lacks what its profile or Corral needs
            warn(f"{c.cluster}: {warning}")


def render_gpus(report: GpuReport, gpu: str | None, shared: bool = False) -> None:
    """The table; `shared`: answered from the server's latest probes (`--max-age`), whose age it says."""
    table = new_table(("CLUSTER", "PARTITION", "GPU", "GRES TYPE", "FREE", "TOTAL", "NODES", "PENDING"),
                      right=("FREE", "TOTAL", "NODES", "PENDING"))
    for r in report.rows:
        free = styled(str(r.free), "green") if r.free else styled("0", "dim")
        slurm = on_slurm(r.raw)  # a pool or a context has no partitions: ssh/lab, -
        table.add_row(r.cluster if slurm else str(r.raw["infra"]), r.partition if slurm else "-", r.gpu,
                      r.gres_type or "(untyped)", free, str(r.total), str(r.nodes), str(r.pending))
    for f in report.failures:  # as its place's rows would be: alpine, ssh/lab, k8s/ctx
        table.add_row(f.cluster if on_slurm(f.raw) else str(f.raw["infra"]), styled("unavailable", "red"),
                      "-", "-", "-", "-", "-", "-")
    if report.rows or report.failures:
        console.print(table)
    else:
        console.print(f"No GPUs{' matching ' + repr(gpu) if gpu else ''} on any cluster.", markup=False)
    for f in report.failures:
        err_console.print(f"[red]✗[/red] {literal(f.error_message)}")
    age = time.time() - report.as_of if shared and report.as_of is not None else 0
    if age >= 1:
        err_console.print(f"[dim]as of {age:.0f} s ago (--max-age; 0 probes now)[/dim]")


# ---- launch, queue --------------------------------------------------------------------------------

def _start(row: dict[str, Any]) -> str:
    return start_text(can_start_now=bool(row.get("can_start_now")), predicted_start=row.get("predicted_start"),
                      prediction=row.get("prediction"), feasible=bool(row.get("feasible")))


def render_plan(rows: list[dict[str, Any]], full: bool) -> None:
    """A plan (the API's rows, best first): all of it on stdout for --dryrun, else the first five
    feasible rows on stderr as a launch goes."""
    table = new_table(("", "INFRA", "RESOURCES", "FREE GPUS", "START", "WHY NOT"))
    placed = [r for r in rows if not r.get("unreachable")]
    shown = placed if full else [r for r in placed if r.get("feasible")][:5]
    for r in shown:
        mark = styled("→", "green") if r.get("chosen") else ""
        table.add_row(mark, str(r["infra"]), str(r.get("resources") or "-"),
                      str(r.get("free_gpus")) if r.get("feasible") else "-", _start(r),
                      "" if r.get("feasible") else styled(str(r.get("reason") or ""), "dim"))
    for r in rows:
        if r.get("unreachable"):
            table.add_row("", str(r["infra"]), "-", "-", "-", styled(str(r.get("reason") or ""), "red"))
    if table.row_count:  # else the error that follows says why no place can run it
        (console if full else err_console).print(table)
    sends = {r["cluster"]: r["transfer_bytes"] for r in shown if r.get("feasible") and r.get("transfer_bytes") is not None}
    if full and any(sends.values()):  # --dryrun: what the task's files cost to send to each cluster
        from corral.sdk.files import size_text

        console.print("\nFiles to send: " + ", ".join(f"{c} {size_text(b)}" for c, b in sends.items())
                      + " (a cluster's cache of the workdir gets only the changes)", markup=False)
    scripts = [r for r in shown if r.get("feasible") and r.get("sbatch_command")]
    if full and scripts:  # --dryrun of a job script: what each candidate would receive
        for r in scripts:
            console.print(f"\n[bold]{literal(str(r['infra']))}[/bold]: {literal(str(r['sbatch_command']))}")
            console.print(r.get("script_diff") or "(the script as written: nothing to rewrite)",
                          markup=False, end="" if r.get("script_diff") else "\n")
    settled = [r for r in shown if r.get("feasible") and r.get("runs_with_text") and not r.get("sbatch_command")]
    if full and settled:  # --dryrun: what each candidate would run with (its cluster's profile, the task's slurm:)
        console.print("\n[bold]Runs with[/bold]")
        for r in settled:
            console.print(f"  {r['infra']}: {r['runs_with_text']}", markup=False)


class LaunchProgress:
    """What a launch tells the person at the terminal, from the server's events (on stderr): a status
    line for the step it is in, the plan's best rows, each cluster skipped and the submission."""

    def __init__(self) -> None:
        self._status: Any = None

    def __call__(self, event: dict[str, Any]) -> None:
        kind = event.get("event")
        if kind == "step":
            self._show(str(event.get("detail") or event.get("step")))
        elif kind == "plan":
            self.clear()
            render_plan(event.get("plan") or [], full=False)
        elif kind == "warning":
            self.clear()
            warn(str(event.get("message")))
        elif kind == "skipped":
            self.clear()
            skipped = f"{event['infra']} skipped: {event['reason']}"
            err_console.print(f"[yellow]↷[/yellow] {literal(skipped)}")
        elif kind == "submitted":
            self.clear()
            ids = list(event.get("job_ids") or [])
            shown = ", ".join(ids[:3]) + (" …" if len(ids) > 3 else "")
            where = place_of(event)
            what = "Slurm job" if on_slurm(event) else "task"
            submitted = f"{shown} submitted to {where} as {what} {handle_in(event)}"
            err_console.print(f"[green]✓[/green] {literal(submitted)}")

    def waiting(self, text: str) -> None:
        self._show(text)

    def _show(self, text: str) -> None:
        if not err_console.is_terminal:
            return
        if self._status is None:
            self._status = err_console.status(styled(text))
            self._status.start()
        else:
            self._status.update(styled(text))

    def clear(self) -> None:
        if self._status is not None:
            self._status.stop()
            self._status = None


def sweep_json(shares: list[dict[str, Any]]) -> list[dict[str, object]]:
    """One object per job of a sweep, with its array task's Slurm id."""
    out: list[dict[str, object]] = []
    for share in shares:
        for job_id, handle in zip(share["job_ids"], share["handles"]):
            out.append({"job_id": job_id, "cluster": share["cluster"], "partition": share["partition"],
                        "handle": handle, "slurm_job_id": handle})
    return out


def submitted_json(share: dict[str, Any]) -> dict[str, object]:
    """A one-job launch's --json, as it always was."""
    return {**{k: share[k] for k in ("job_id", "job_ids", "cluster", "partition")}, "handle": handle_in(share),
            "slurm_job_id": handle_in(share), "skipped": share["skipped"]}


def _where(job: Any) -> str:
    """A job's place, short: alpine/gpu for Slurm (the queue's usual), ssh/lab for a pool."""
    raw = job.raw if hasattr(job, "raw") else {}
    return place_of({"cluster": job.cluster, "partition": job.partition, **raw}).removeprefix("slurm/")


def _queue_columns(jobs: list[Job]) -> tuple[str, ...]:
    return ("ID", "NAME", "INFRA", handle_header(j.raw for j in jobs), "STATE", "REASON", "SUBMITTED", "STARTED",
            "ENDED")


def _job_row(j: Job) -> tuple[str | Text, ...]:
    where = _where(j) if j.cluster else "-"  # "-": it never reached a cluster
    return (j.job_id, j.name, where, j.handle or "-", state_cell(j.state),
            _reason(j), when(j.submitted_at), when(j.started_at), when(j.ended_at))


def _reason(j: Job) -> str:
    """Its reason; for a job that failed on its own, its exit code (sacct's ExitCode) rather than
    Slurm's bare `NonZeroExitCode` or nothing."""
    if j.state == "FAILED" and j.exit_code is not None and j.reason in (None, "", "NonZeroExitCode"):
        return f"exit code {j.exit_code}"
    return j.reason or ""


def _sweep_row(jobs: list[Job], counts: dict[str, int], times: list[float | None]) -> tuple[str | Text, ...]:
    """One row for a whole sweep: its jobs per state (all of them, not only those on the page), its first
    submission, its first job's start and, once none is live, its last one's end."""
    first = jobs[0]
    places = sorted({_where(j) for j in jobs})
    total = sum(counts.values()) or len(jobs)
    states = Text(", ").join(Text.assemble(f"{n} ", state_cell(state))
                             for state, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    # its Slurm array's id (`4711` of `4711_3`), when every job is on the page and in that one array
    arrays = {str(j.handle).partition("_")[0] if "_" in str(j.handle) else None for j in jobs}
    array = arrays.pop() if len(arrays) == 1 and len(jobs) == total else None
    return (f"{first.sweep_id} (sweep)", f"{first.name} ×{total}",
            places[0] if len(places) == 1 else f"{len(places)} places", array or "-", states, "",
            when(times[2] if len(times) > 2 else min((j.submitted_at or 0) for j in jobs) or None),
            when(times[0] if times else None),
            when(times[1] if len(times) > 1 else None))


def queue_rows(page: QueuePage, expand: bool) -> list[tuple[str | Text, ...]]:
    rows: list[tuple[str | Text, ...]] = []
    seen: set[str] = set()
    for j in page.jobs:
        sweep = j.sweep_id
        if sweep and not expand:
            if sweep not in seen:
                seen.add(sweep)
                rows.append(_sweep_row([k for k in page.jobs if k.sweep_id == sweep], page.sweeps.get(sweep, {}),
                                       page.sweep_times.get(sweep, [])))
            continue
        rows.append(_job_row(j))
    return rows


def render_queue(page: QueuePage, expand: bool = False, live_only: bool = False) -> None:
    if not page.jobs:
        console.print("No live jobs." if live_only else "No jobs." if not page.more else "No jobs on this page.")
        return
    owners = [j.raw.get("owner") or "-" for j in page.jobs]
    mixed = len(set(owners)) > 1  # an admin's view of several users' jobs: say whose each is
    numbered = any(j.number for j in page.jobs)  # a dev allocation's jobs: 1, 2, … as `sky queue CLUSTER`
    columns = _queue_columns(page.jobs)
    table = new_table((("#",) if numbered else ()) + columns[:1] + (("OWNER",) if mixed else ()) + columns[1:])
    rows = queue_rows(page, expand)
    if mixed:
        by_id = {j.job_id: owner for j, owner in zip(page.jobs, owners)}
        by_sweep = {j.sweep_id: owner for j, owner in zip(page.jobs, owners) if j.sweep_id}
        rows = [(row[0], by_id.get(row[0]) or by_sweep.get(row[0].removesuffix(" (sweep)"), "-"), *row[1:])
                for row in rows]
    if numbered:
        numbers = {j.job_id: str(j.number or "-") for j in page.jobs}
        rows = [(numbers.get(str(row[0]), "-"), *row) for row in rows]
    for row in rows:
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
    table = new_table(_queue_columns(jobs), show_header=header)
    for j in jobs:
        table.add_row(*_job_row(j))
    console.print(table)


def _memory(gb: float) -> str:
    """Memory as Slurm's TRES shows it: whole GB as G, else MB as M (1000M, not 0.98G)."""
    return f"{gb:g}G" if float(gb).is_integer() else f"{round(gb * 1024)}M"


def allocation_state(allocation: dict[str, Any]) -> str:
    """"PENDING (Resources; Slurm expects it to start 14:05:09)", from the API's JSON."""
    why = "; ".join(filter(None, (allocation.get("reason"), expected_start(allocation.get("expected_start")))))
    return str(allocation["state"]) + (f" ({why})" if why else "")


def render_status(allocations: list[dict[str, Any]]) -> None:
    """Dev allocations, from the API's JSON."""
    if not allocations:
        console.print("No dev allocations. Create one with `corral launch -c NAME --gpus H100:1`.")
        return
    table = new_table(("NAME", "INFRA", "RESOURCES", "STATE", "AGE", "IDLE", "TIME LEFT", "NODES"))
    for a in allocations:
        state = allocation_state(a)
        idle_for = a.get("idle_seconds")
        idle = duration(idle_for) if isinstance(idle_for, (int, float)) and a["state"] == "READY" else "-"
        limit = f"/{duration(a['idle_limit_seconds'])}" if a.get("idle_limit_seconds") else ""
        given = (f", cpu={a['cpus_per_node']}" if a.get("cpus_per_node") else "") + (
            f", mem={_memory(a['memory_gb_per_node'])}" if a.get("memory_gb_per_node") else "") + (
            f", image={str(a['image_id']).removeprefix('docker:')}" if a.get("image_id") else "")
        table.add_row(str(a["name"]), place_of(a).removeprefix("slurm/"),
                      f"{a['num_nodes']}x {a.get('accelerators') or a.get('gres') or 'cpu'}{given}",
                      state, duration(a["age_seconds"]), idle + limit, str(a.get("time_left") or "-"),
                      ",".join(a.get("nodes") or []) or "-")
    console.print(table)
