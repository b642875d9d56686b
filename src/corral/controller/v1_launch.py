"""The `/v1` routes that take a task: uploads of its files, launch (plan, `dryrun`, sweeps) and managed
jobs (launch, cancel, logs per attempt, why pending).

A launch answers a stream of events, one JSON object per line, as the engine goes: `step` (probe, plan,
sync, submit), `plan`, `skipped` (failover), `submitted` (a share: one job or one array), then `done`
with the result, or `error` with a CorralError's message, class and exit code. The task is checked
before the stream starts, so a bad task is a plain 400. The launch runs on as its own asyncio task: a
client that goes away (Ctrl-C) does not interrupt a submission halfway.
"""

from __future__ import annotations

import asyncio
import json
import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Annotated, Any, Literal

from fastapi import APIRouter, Path, Query, Request
from fastapi.responses import StreamingResponse
from pydantic import Field, field_validator

from corral import buckets, jobgroup, managed, pacing, uploads
from corral.managed import MAX_PIPELINE_TASKS
from corral.client import Client
from corral.controller.auth import Me, Principal, owner_of_all
from corral.controller.background import run_on
from corral.controller.refusals import STREAM_REFUSALS, RequestBody
from corral.errors import CorralError, InternalError, TaskError, stream_error_line
from corral.infra.base import JobState
from corral.launch import (
    Launcher,
    LaunchEvents,
    NoFeasibleClusterError,
    no_candidate_message,
    no_candidate_reasons,
)
from corral.state import Store
from corral.state.models import ManagedState
from corral.state.store import MANAGED_TERMINAL
from corral.task import Task, apply_overrides, job_environment, parse_task
from corral.task_compat import ignored_fields
from corral.taskfile import MAX_SWEEP_JOBS, MAX_TASK_FILE_BYTES, parse_yaml, repeated_keys
from corral.tracker import check_log_kept
from corral.views import explain_pending, plan_json, submitted_json, sweeps_named_by_first_job

Digest = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
OUTPUT_BACKLOG = 64  # chunks (up to 64 KiB each) an output stream holds for a slow client before its reader waits
Text = Annotated[str, Field(max_length=4096)]


class TaskFiles(RequestBody):
    """The uploads that stand for the task's local paths (`PUT /v1/uploads/{sha256}` first)."""

    workdir: Digest | None = None
    workdir_origin: Text | None = Field(None, description="host:/path the client read the workdir from "
                                                          "(keys the cluster-side cache)")
    file_mounts: dict[Annotated[str, Field(max_length=4096)], Digest] = Field(default_factory=dict, max_length=1000)


Word = Annotated[str, Field(max_length=4096)]


class ScriptInput(RequestBody):
    """An sbatch job script, run as it is (`corral sbatch [OPTIONS] script [ARGS]`)."""

    text: Annotated[str, Field(max_length=MAX_TASK_FILE_BYTES)] = Field(description="The script, byte for byte")
    file_name: Annotated[str, Field(min_length=1, max_length=128)] = "job.sh"
    options: list[Word] = Field(default_factory=list, max_length=1000,
                                description="sbatch options from the command line, as words")
    args: list[Word] = Field(default_factory=list, max_length=1000, description="The script's arguments")


class TaskInput(RequestBody):
    source: Annotated[str, Field(min_length=1, max_length=1000)] = "task"
    yaml: Annotated[str, Field(max_length=MAX_TASK_FILE_BYTES)] | None = Field(
        None, description="The task file's text (SkyPilot's task YAML)")
    run: Annotated[str, Field(max_length=MAX_TASK_FILE_BYTES)] | None = Field(
        None, description="A one-line task instead: `corral launch -- COMMAND`")
    script: ScriptInput | None = Field(None, description="An sbatch job script instead (`corral sbatch`)")
    files: TaskFiles = Field(default_factory=TaskFiles)


def _key_value(items: list[str]) -> list[str]:
    for item in items:
        if "=" not in item:
            raise ValueError(f"{item!r}: expected KEY=VALUE (a client resolves `--secret KEY` from its own "
                             "environment)")
    return items


class Overrides(RequestBody):
    name: Text | None = None
    gpus: Text | None = None
    infra: Text | None = None
    num_nodes: int | None = Field(None, ge=1, le=100_000)
    cpus: Text | None = None
    memory: Text | None = None
    envs: list[Annotated[str, Field(max_length=MAX_TASK_FILE_BYTES)]] = Field(default_factory=list, max_length=1000)
    secrets: list[Annotated[str, Field(max_length=MAX_TASK_FILE_BYTES)]] = Field(default_factory=list,
                                                                                max_length=1000)
    time: Text | None = Field(None, description="Walltime (sbatch --time)")
    workdir: Text | None = Field(None, description="The task's workdir replaced: its files are sent as `files.workdir`")
    image_id: Text | None = Field(None, description="The task's image replaced (docker:<image>)")

    _pairs = field_validator("envs", "secrets")(_key_value)


class LaunchRequest(RequestBody):
    tasks: list[TaskInput] = Field(min_length=1, max_length=100)
    overrides: Overrides = Field(default_factory=Overrides)
    num_jobs: int = Field(1, ge=1, le=MAX_SWEEP_JOBS)
    dryrun: bool = False
    dev: bool = Field(False, description="With `dryrun`: the plan of a dev allocation (`launch -c NAME "
                                         "--dryrun`), where a place that cannot hold one is not feasible")


Delay = Annotated[str, Field(max_length=32)] | Annotated[float, Field(ge=0)]


class PipelineInput(RequestBody):
    """A managed pipeline: tasks that run one after another, each once the one before it succeeded; or,
    with `execution: parallel`, a job group: tasks that run side by side on one cluster."""

    name: Text | None = Field(None, description="The pipeline's name (the file's first document's `name`)")
    tasks: list[TaskInput] = Field(min_length=1, max_length=MAX_PIPELINE_TASKS)
    execution: Literal["serial", "parallel"] = Field("serial", description="`parallel`: a job group")
    primary_tasks: list[Annotated[str, Field(max_length=256)]] | None = Field(
        None, max_length=MAX_PIPELINE_TASKS, description="A job group's tasks that drive it (all when absent)")
    termination_delay: Delay | dict[Annotated[str, Field(max_length=256)], Delay] | None = Field(
        None, description="How long a job group's other tasks run on once its primary tasks have ended: one "
                          "duration (30s, 5m, 1h, or seconds), or one per task name with a `default`")


class ManagedLaunchRequest(RequestBody):
    task: TaskInput | None = Field(None, description="The task (give this or `pipeline`)")
    pipeline: PipelineInput | None = Field(None, description="A pipeline of tasks instead (`num_jobs` 1); "
                                                             "`overrides` apply to each task, `name` to the pipeline")
    overrides: Overrides = Field(default_factory=Overrides)
    num_jobs: int = Field(1, ge=1, le=MAX_SWEEP_JOBS)


class ManagedCancelRequest(RequestBody):
    jobs: list[Annotated[str, Field(min_length=1, max_length=200)]] = Field(default_factory=list, max_length=10_000)
    all: bool = Field(False, description="Every live managed job of yours (with `all_users`, everyone's).")
    all_users: bool = Field(False, description="With `all`: every user's, not only yours (admins only).")


def build_task(given: TaskInput, overrides: Overrides, owner: str = "", store: Store | None = None, *,
               scripts: bool = True) -> tuple[Task, str]:
    """The task the client sent, with its overrides, its files as server-side paths; validated. A job
    script's dependencies on Corral jobs are looked up in `store`, among `owner`'s jobs."""
    source = given.source
    if sum(x is not None for x in (given.yaml, given.run, given.script)) > 1:
        raise TaskError("give one of a task file, `-- COMMAND` or a job script")
    if given.script is not None and not scripts:
        raise TaskError(f"{source}: a job script runs as its own batch job (corral sbatch); a dev allocation takes "
                        "a task file or a command")
    if given.script is not None:
        return _script_task(given, overrides, owner, store), source
    if given.run is not None:
        task, source = parse_task({"run": given.run}, "command line"), "command line"
    elif given.yaml is not None:
        task = parse_task(parse_yaml(given.yaml, source), source)
    else:
        task = parse_task({}, source)
    task = apply_overrides(task, source, name=overrides.name, gpus=overrides.gpus, infra=overrides.infra,
                           num_nodes=overrides.num_nodes, cpus=overrides.cpus, memory=overrides.memory,
                           envs=overrides.envs, secrets=overrides.secrets, workdir=overrides.workdir,
                           image_id=overrides.image_id)
    if overrides.time:
        task = parse_task({**task.model_dump(exclude_none=True),
                           "slurm": {**task.slurm.model_dump(exclude_none=True), "time": overrides.time}}, source)
    return uploads.with_uploads(task, given.files.model_dump(), owner), source


def _script_task(given: TaskInput, overrides: Overrides, owner: str, store: Store | None) -> Task:
    """A job script's task: its resources are the script's own; a place, envs, secrets and a workdir may
    be given besides."""
    assert given.script is not None
    from pydantic import ValidationError

    from corral.script_task import task_from_script
    from corral.task import JobScript, format_validation_error

    fixed = {"name": overrides.name, "gpus": overrides.gpus, "num_nodes": overrides.num_nodes,
             "cpus": overrides.cpus, "memory": overrides.memory, "time": overrides.time,
             "image_id": overrides.image_id}
    given_too = [name for name, value in fixed.items() if value is not None]
    if given_too:
        raise TaskError(f"{given.source}: a job script says what it needs in its #SBATCH lines; give "
                        f"{', '.join(given_too)} as sbatch options (e.g. corral sbatch --gres=gpu:h100:2 "
                        "--time=1:00:00 script.sh), not as Corral's")
    try:
        script = JobScript.model_validate(given.script.model_dump())
    except ValidationError as exc:
        unplaced = [e["msg"].removeprefix("Value error, ") for e in exc.errors() if not e["loc"]]
        if unplaced:  # the script's own reader: its message names the file and line
            raise TaskError(unplaced[0]) from None
        raise TaskError(format_validation_error(exc, given.source).replace("invalid task", "invalid job script")
                        ) from None

    def find_job(job_id: str) -> tuple[str, str | None]:
        if store is None:
            raise KeyError(job_id)
        try:
            view = store.resolve(job_id, owner or None)
        except CorralError:
            raise KeyError(job_id) from None
        return view.attempt.cluster, view.attempt.handle

    def find_clusters(slurm_id: str) -> list[str]:
        return store.clusters_of_native_job(slurm_id, owner or None) if store is not None else []

    task = task_from_script(script.model_copy(update={"dependencies": {}}), given.source, infra=overrides.infra,
                            find_job=find_job, find_clusters=find_clusters)
    task = apply_overrides(task, given.source, envs=overrides.envs, secrets=overrides.secrets,
                           workdir=overrides.workdir)
    return uploads.with_uploads(task, given.files.model_dump(), owner)


def script_rows(task: Task, previews: dict[tuple[str, str], tuple[str, str]]) -> dict[tuple[str, str], dict[str, str]]:
    """Per candidate of a job script's dry run: the script it would receive, as a diff against the
    original (empty when nothing changes), and sbatch's command line there."""
    import difflib

    if task.slurm.script is None:
        return {}
    original = task.slurm.script.text
    name = task.slurm.script.file_name
    return {key: {"script_diff": "".join(difflib.unified_diff(
                      original.splitlines(keepends=True), text.splitlines(keepends=True),
                      f"{name} (as written)", f"{name} (on slurm/{key[0]}/{key[1]})")),
                  "sbatch_command": command}
            for key, (text, command) in previews.items()}


def warning_lines(task: Task, source: str, *, dev: bool = False, text: str | None = None) -> list[str]:
    """One line for each key written twice in the task's YAML `text` (the later one is used) and for each
    SkyPilot field of the task that has no meaning on Slurm, named by its source."""
    repeated = [f"{path}: written twice in one mapping; the earlier one is ignored (YAML keeps the last, "
                "SkyPilot too): merge them"
                for path in (repeated_keys(text) if text else [])]
    return [f"{source}: {line}" for line in [*repeated, *ignored_fields(task, dev=dev)]]


def put_warnings(put: Put, task: Task, source: str, *, dev: bool = False, text: str | None = None) -> None:
    """A `warning` event for each line of warning_lines."""
    for message in warning_lines(task, source, dev=dev, text=text):
        put({"event": "warning", "message": message})


Put = Callable[[dict[str, Any]], None]


def launch_events(put: Put) -> LaunchEvents:
    """The engine's launch callbacks as the API's events."""
    return LaunchEvents(
        step=lambda step, detail: put({"event": "step", "step": step, "detail": detail}),
        plan=lambda plan: put({"event": "plan", "plan": plan_json(plan)}),
        skipped=lambda infra, why: put({"event": "skipped", "infra": infra, "reason": why}),
        submitted=lambda s: put({"event": "submitted", **submitted_json(s)}),
    )


class JsonLines(StreamingResponse):
    """One JSON object per line: a launch's progress events (ending with `done` or `error`), or jobs."""

    media_type = "application/x-ndjson"


class OutputStream(StreamingResponse):
    """A job's output as its bytes."""

    media_type = "application/octet-stream"


def event_stream(work: Callable[[Put], Awaitable[dict[str, Any]]],
                 gone: asyncio.Event | None = None) -> StreamingResponse:
    """Run `work` as its own task and stream the events it puts, then `done` or `error`. `gone` is
    set once the stream ends: early when the client went away (work goes on, unread)."""
    queue: asyncio.Queue[dict[str, Any] | None] = asyncio.Queue()
    put = queue.put_nowait

    async def run() -> None:
        try:
            put({"event": "done", **await work(put)})
        except CorralError as exc:
            put({"event": "error", "message": str(exc), "kind": type(exc).__name__, "exit_code": exc.exit_code})
        except Exception as exc:  # noqa: BLE001 - reported to the client as a bug, logged in full here
            traceback.print_exception(exc)
            put({"event": "error", "message": f"internal error: {type(exc).__name__}: {exc}",
                 "kind": InternalError.__name__, "exit_code": InternalError.exit_code})
        finally:
            put(None)

    run_on(run())

    async def body() -> AsyncIterator[bytes]:
        try:
            while (item := await queue.get()) is not None:
                yield (json.dumps(item) + "\n").encode()
        finally:
            if gone is not None:
                gone.set()

    return JsonLines(body())


def add_routes(router: APIRouter, store: Store, wake: Callable[[], None],
               slow: Callable[[], dict[str, str]] = dict) -> None:
    """`slow`: the clusters a launch leaves out now, with why (their status queries are overdue)."""

    @router.get("/uploads/{digest}")
    async def upload_held(me: Me, digest: Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")]) -> dict[str, object]:
        """Whether the server holds these files from you already (then they need not be sent), and the
        most it takes in one upload (`max_bytes`)."""
        from corral.limits import send_limit

        return {"digest": digest, "held": uploads.upload_path(digest, me.owner) is not None,
                "max_bytes": send_limit()}

    @router.put("/uploads/{digest}")
    async def upload(me: Me, digest: Annotated[str, Path(pattern=r"^[0-9a-f]{64}$")],
                     request: Request) -> dict[str, object]:
        """Store a task's files: a tar archive (a folder as tree/, a file as file/<name>) named by its SHA-256."""
        declared = request.headers.get("content-length")
        await uploads.receive(digest, request.stream(), me.owner, int(declared) if declared else None)
        return {"digest": digest, "held": True}

    @router.post("/launch", response_class=JsonLines, responses=STREAM_REFUSALS)
    async def launch(me: Me, request: LaunchRequest) -> StreamingResponse:
        """Plan and submit tasks (with `dryrun`, plan only), streaming events as it goes."""
        built = [build_task(t, request.overrides, me.owner, store) for t in request.tasks]
        launcher_store = store

        async def work(put: Put) -> dict[str, Any]:
            for (task, source), given in zip(built, request.tasks):
                put_warnings(put, task, source, text=given.yaml)
            launcher = Launcher(Client(), launcher_store, launch_events(put), owner=me.owner, slow=slow())
            if request.dryrun:  # nothing fetched: object storage is only listed, for its size
                for task, source in built:  # a null env or secret, which the launch would refuse
                    job_environment(task, source)
                plans = [await launcher.plan(task, predict="all", holding=request.dev) for task, _ in built]
                for plan in plans:
                    if not plan.candidates and not plan.unreachable:  # no row to show why: say it
                        raise NoFeasibleClusterError(no_candidate_message(plan))
                sizes = [await launcher.transfer_sizes(task, plan) for (task, _), plan in zip(built, plans)]
                scripts = [script_rows(task, launcher.script_previews(task, plan)) for (task, _), plan in zip(built, plans)]
                return {"plans": [[{**row, "transfer_bytes": size.get(row.get("cluster")),
                                    **script.get((row.get("cluster"), row.get("partition")), {})}
                                   for row in plan_json(p)]
                                  for p, size, script in zip(plans, sizes, scripts)]}
            step = launch_events(put).step
            ready = [(await buckets.fetched(task, me.owner, lambda d: step("fetch", d)), source)
                     for task, source in built]
            per_task = await launcher.launch_many(ready, num_jobs=request.num_jobs)
            return {"tasks": [[submitted_json(s) for s in shares] for shares in per_task]}

        return event_stream(work)

    @router.post("/managed")
    async def managed_launch(me: Me, request: ManagedLaunchRequest) -> dict[str, object]:
        """Record managed jobs, or a pipeline's tasks; the controller places and watches them (woken now)."""
        if (request.task is None) == (request.pipeline is None):
            raise TaskError("give a task or a pipeline, not both and not neither")
        if request.pipeline is not None:
            return await _record_pipeline(me, request.pipeline, request.overrides, request.num_jobs)
        task, source = build_task(request.task, request.overrides, me.owner, store)
        task = await _recorded_copy(task, me.owner)
        ids = managed.record(store, task, source, request.num_jobs, owner=me.owner)
        wake()
        return {"job_id": ids[0], "job_ids": ids, "warnings": warning_lines(task, source, text=request.task.yaml)}

    async def _recorded_copy(task: Task, owner: str) -> Task:
        """A managed task as it is recorded: its object storage fetched to the server (recoveries re-send
        the server's copy), and its local files checked."""
        task = await buckets.fetched(task, owner)
        Launcher.check_local_files(task)
        return task

    async def _record_pipeline(me: Principal, pipeline: PipelineInput, overrides: Overrides,
                               num_jobs: int) -> dict[str, object]:
        if num_jobs != 1:
            raise TaskError("--num-jobs: a pipeline runs once; launch it again for another run")
        each = overrides.model_copy(update={"name": None})  # the name is the pipeline's
        built = [build_task(given, each, me.owner, store) for given in pipeline.tasks]  # all checked first
        ready = [(await _recorded_copy(task, me.owner), source) for task, source in built]
        parallel = pipeline.execution == "parallel"
        name = overrides.name or pipeline.name or ready[0][0].name or ("group" if parallel else "pipeline")
        ids = managed.record_pipeline(store, name, ready, owner=me.owner, parallel=parallel,
                                      primary_tasks=pipeline.primary_tasks,
                                      termination_delay=pipeline.termination_delay)
        wake()
        auxiliary = [job_id for job_id, (task, _) in zip(ids, ready)
                     if parallel and not jobgroup.is_primary(task.name, pipeline.primary_tasks)]
        return {"job_id": ids[0], "job_ids": ids, "pipeline": name, "execution": pipeline.execution,
                "auxiliary": auxiliary,
                "warnings": [line for (task, source), given in zip(ready, pipeline.tasks)
                             for line in warning_lines(task, source, text=given.yaml)]}

    @router.post("/managed/cancel")
    async def managed_cancel(me: Me, request: ManagedCancelRequest) -> dict[str, object]:
        """Ask the controller to cancel managed jobs (it scancels their attempts on its next tick, now)."""
        if not request.jobs and not request.all:
            raise CorralError("name the jobs to cancel, or use --all")
        named = [] if request.all else [(ref, managed.resolve_all(store, ref, me.scope)) for ref in request.jobs]
        views = (managed.views(store, scope=owner_of_all(me, request.all, request.all_users), live_only=True)
                 if request.all else [v for _, found in named for v in found])
        live = [v for v in views if v.managed.state not in MANAGED_TERMINAL]
        managed.request_cancel(store, [v.job.id for v in live])
        wake()
        sweeps = sweeps_named_by_first_job(store, named, me.scope, managed_only=True)
        return {"jobs": [{"job_id": v.job.id, "cancelling": v in live, "state": v.managed.state,
                          **({"sweep": sweeps[v.job.id]} if v.job.id in sweeps else {})} for v in views]}

    @router.get("/managed/{job}/attempts/{number}/logs", response_class=OutputStream, responses=STREAM_REFUSALS)
    async def attempt_logs(me: Me, job: Annotated[str, Path(max_length=200)],
                           number: Annotated[int, Path(ge=1, le=1_000_000)], follow: bool = False,
                           tail: Annotated[int, Query(ge=0, le=10_000_000)] = 0) -> StreamingResponse:
        """One attempt's output (all nodes; with `tail` > 0, the last `tail` lines); with `follow`, until it ends."""
        view = managed.resolve(store, job, me.scope)
        attempt = next((a for a in view.attempts if a.number == number and a.handle), None)
        if attempt is None:
            raise CorralError(f"{view.job.id} has no attempt {number} on a cluster; see `corral jobs events`")
        check_log_kept(view.job.id, attempt)
        infra = Client().infra(attempt.cluster, view.job.owner)
        return stream_output(lambda sink: infra.logs(attempt.handle or "", attempt.log_path, follow, sink, tail))

    @router.get("/managed/{job}/why")
    async def why(me: Me, job: Annotated[str, Path(max_length=200)]) -> dict[str, object]:
        """Why a pending managed job waits where it is (lines of text), from a fresh plan."""
        from corral.controller.engine import _task
        from corral.controller.rules import ControllerSettings

        view = managed.resolve(store, job, me.scope)
        latest = view.latest
        if latest is None and view.managed.state == ManagedState.PENDING:  # not placed: can any place run it?
            plan = await Launcher(Client(), store, owner=view.job.owner).plan(_task(view.job), predict="never")
            if not plan.feasible():
                return {"job_id": view.job.id, "pending": True,
                        "lines": [f"{view.job.id} is PENDING: no cluster can run it now:",
                                  *(f"  {line}" for line in no_candidate_reasons(plan))]}
        if latest is None or latest.state not in (JobState.PENDING, JobState.SUBMITTING):
            return {"job_id": view.job.id, "pending": False,
                    "lines": [f"{view.job.id} is {view.managed.state}"
                              + (f": {view.managed.reason}" if view.managed.reason else "")]}
        plan = await Launcher(Client(), store, owner=view.job.owner).plan(_task(view.job), predict="all")
        return {"job_id": view.job.id, "pending": True,
                "lines": explain_pending(view, plan, ControllerSettings.from_env())}


def stream_output(source: Callable[[Callable[[bytes], None]], Awaitable[None]]) -> StreamingResponse:
    """Bytes a remote reader hands to a sink, streamed; the reader ends when the client goes away, and
    waits (pacing.keep_pace) while OUTPUT_BACKLOG chunks are still to be sent: a client that stops
    reading holds up the reading, not the server's memory."""
    chunks: asyncio.Queue[bytes | None] = asyncio.Queue()
    room = asyncio.Event()
    room.set()
    line_ended = True

    def put(chunk: bytes) -> None:
        nonlocal line_ended
        if chunk:
            line_ended = chunk.endswith(b"\n")
        chunks.put_nowait(chunk)
        if chunks.qsize() >= OUTPUT_BACKLOG:
            room.clear()

    async def pump() -> None:
        pacing.OUTPUT_PACE.set(room.wait)  # (this task's own context: its readers see it)
        try:
            await source(put)
        except CorralError as exc:  # said as the stream's last line, on a line of its own
            chunks.put_nowait((b"" if line_ended else b"\n") + stream_error_line(exc))
        except Exception as exc:  # noqa: BLE001 - a bug: said to the client as one, logged in full here
            traceback.print_exception(exc)
            error = InternalError(f"internal error: {type(exc).__name__}: {exc}")
            chunks.put_nowait((b"" if line_ended else b"\n") + stream_error_line(error))
        finally:
            chunks.put_nowait(None)

    async def body() -> AsyncIterator[bytes]:
        task = asyncio.ensure_future(pump())
        try:
            while (chunk := await chunks.get()) is not None:
                if chunks.qsize() < OUTPUT_BACKLOG:
                    room.set()
                yield chunk
        finally:
            task.cancel()  # the reader went away: end the remote `tail -F`

    return OutputStream(body())

