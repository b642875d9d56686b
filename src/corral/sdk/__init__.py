"""Corral's Python SDK: the same HTTP API the `corral` command uses, with typed results.

    from corral.sdk import Client

    client = Client()                      # this user's local server, started on demand
    for check in client.check():
        print(check.cluster, "OK" if check.ok else check.error)
    for row in client.gpus("H100").rows:
        print(row.cluster, row.partition, row.free, "/", row.total)
    for job in client.queue().jobs:
        print(job.job_id, job.state)
    for chunk in client.logs("c-1234abcd", follow=True):
        print(chunk, end="")

`Client(url, token)` (or `CORRAL_API_URL` and `CORRAL_API_TOKEN`, or `corral api login`) talks to a remote
server instead. Standard library only (and pathspec, for a workdir with ignore rules): importing it loads
neither the engine nor its dependencies.
Every failure is a `CorralError` (an `ApiError` for what the server refused) with the server's message.
"""

from __future__ import annotations

import http.client
import json
import os
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from corral.errors import (
    EXIT_DATAERR,
    EXIT_NOPERM,
    EXIT_UNAVAILABLE,
    STREAM_ERROR,
    CorralError,
    TaskError,
    read_stream_error,
)
from corral.sdk import endpoint as _endpoint
from corral.sdk import transport as _transport
from corral.sdk.types import (
    CancelOutcome,
    ClusterCheck,
    GpuReport,
    GpuRow,
    Job,
    JobStatus,
    Launched,
    ManagedJob,
    ManagedJobStatus,
    PlanRow,
    QueuePage,
    Submission,
    Unreachable,
    status_of,
)

TaskLike = Any  # a path, YAML text, a dict, an object with model_dump(), or None (an empty task)
Pairs = dict[str, str] | list[str] | None  # {"KEY": "VALUE"} or ["KEY=VALUE", "KEY"]

API = "/v1"


class ApiError(CorralError):
    """The server answered with an error: its message, and the HTTP status."""

    def __init__(self, message: str, status: int, kind: str = "", exit_code: int | None = None):
        super().__init__(message)
        self.status = status
        self.kind = kind
        if isinstance(exit_code, int) and 0 < exit_code < 256:
            self.exit_code = exit_code  # the server's error class's, so the CLI exits as it did in-process


class OutputCutError(ApiError):
    """The server could not read a job's output to its end (its cluster or machine stopped answering):
    raised after everything read before it was yielded. `kind` and `exit_code` are the server's error's."""


class ServerUnreachableError(CorralError):
    """No answer from the server (not running, wrong URL, network)."""

    exit_code = EXIT_UNAVAILABLE


class Client:
    def __init__(self, url: str | None = None, token: str | None = None, *, timeout: float = 120.0):
        self._remote = _endpoint.remote(url, token)
        self._endpoint: _endpoint.Endpoint | None = self._remote
        self.timeout = timeout

    @property
    def endpoint(self) -> _endpoint.Endpoint:
        if self._endpoint is None:
            self._endpoint = _endpoint.local()
        return self._endpoint

    # ---- operations -----------------------------------------------------------------------------
    def health(self) -> dict[str, Any]:
        return self._json("GET", "/health")

    def check(self, clusters: list[str] | None = None, *, timeout: float | None = None) -> list[ClusterCheck]:
        """Each cluster's login node and Slurm controller, probed now (in parallel)."""
        data = self._json("GET", "/check", {"cluster": clusters or [], "timeout": timeout})
        return [ClusterCheck.from_json(c) for c in data["clusters"]]

    def gpus(self, gpu: str | None = None, infra: str | None = None, *, timeout: float | None = None,
             max_age: float = 0) -> GpuReport:
        """GPUs per cluster and partition, probed now; with `max_age` (seconds), from the server's latest
        probe of each cluster where it started at most that long ago (shared with every other caller).
        `gpu`: a type (`H100`), or `H100:8` for the partitions where one node has 8 of them."""
        data = self._json("GET", "/gpus", {"gpu": gpu, "infra": infra, "timeout": timeout,
                                           "max_age": max_age or None})
        answered = [c["probed_at"] for c in data.get("clusters") or [] if c.get("probed_at")]
        return GpuReport([GpuRow.from_json(r) for r in data["rows"]],
                         [Unreachable.from_json(f) for f in data["failures"]], min(answered, default=None))

    def queue(self, *, limit: int = 20, page: int = 1, since: float | None = None, allocation: str | None = None,
              by_sweep: bool = False) -> QueuePage:
        """Live jobs and the newest ended ones (`limit` per page), newest first, refreshed from the clusters."""
        data = self._json("GET", "/queue", {"limit": limit, "page": page, "since": since,
                                            "allocation": allocation, "by_sweep": by_sweep})
        return QueuePage([Job.from_json(j) for j in data["jobs"]], int(data["more"]), data.get("sweeps") or {},
                         list(data.get("warnings") or []), data.get("sweep_times") or {})

    def queue_all(self, *, since: float | None = None, allocation: str | None = None) -> Iterator[Job]:
        """Every job, newest first, streamed (memory stays flat on both sides)."""
        for line in self._stream("GET", "/queue/all", {"since": since, "allocation": allocation}, lines=True):
            yield Job.from_json(json.loads(line))

    def jobs(self, *, owner: str = "", state: str = "", cluster: str = "", name: str = "",
             since: float | None = None, allocation: str = "", sweep: str = "", limit: int = 50, page: int = 1
             ) -> tuple[list[Job], int]:
        """One page of jobs, newest first, live or not, and how many match in all; each refreshed from
        the clusters, as the dashboard lists them. `state`: job states (or `live`, or Slurm's `PD`, `R`…),
        comma-separated; `name`: part of the name; `since`: launched since (Unix time); `sweep`: a
        sweep's id (its first job's), for its jobs."""
        data = self._json("GET", "/jobs", {"owner": owner or None, "state": state or None, "cluster": cluster or None,
                                           "name": name or None, "since": since, "allocation": allocation or None,
                                           "sweep": sweep or None, "limit": limit, "page": page})
        return [Job.from_json(j) for j in data["jobs"]], int(data["total"])

    def job(self, job: str, *, allocation: str | None = None) -> Job:
        """A job by id, unique id prefix, name or Slurm job id; with `allocation`, one run in that dev
        allocation of yours, by its number there (`"2"`, as `sky logs CLUSTER 2`) or its id or name."""
        return Job.from_json(self._json("GET", f"/jobs/{_quoted(job)}", {"allocation": allocation}))

    def logs(self, job: str, follow: bool = False, *, tail: int = 0, allocation: str | None = None,
             stderr: bool = False) -> Iterator[bytes]:
        """A job's output as it comes (all nodes; with `tail` > 0, its last `tail` lines first); with
        `follow`, until the job's tasks are over. `allocation` as for `job`. `stderr`: the file its sbatch
        script's `--error` sends stderr to, apart from the output (`Job.stderr_path`)."""
        yield from _cut_raised(self._stream("GET", f"/jobs/{_quoted(job)}/logs",
                                            {"follow": follow, "tail": tail or None, "allocation": allocation,
                                             "stderr": stderr}))

    def cancel(self, jobs: str | list[str] | None = None, *, all: bool = False, all_users: bool = False
               ) -> list[CancelOutcome]:
        """Cancel jobs (one id or name, or a list; one scancel per cluster); ended ones are reported as
        they are. `all`: every live job of yours; with `all_users` (admins), every user's."""
        data = self._json("POST", "/cancel", body={"jobs": _job_list(jobs), "all": all, "all_users": all_users})
        return [CancelOutcome(c["job_id"], bool(c["cancelled"]), status_of(JobStatus, c["state"]), *_sweep_of(c))
                for c in data["jobs"]]

    def wait(self, job: str, *, poll: float = 2.0, timeout: float | None = None) -> Job:
        """Until the job has ended; returns it (its state says how)."""
        import time

        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            found = self.job(job)
            if found.ended:
                return found
            if deadline is not None and time.monotonic() > deadline:
                raise CorralError(f"{job} still {found.state} after {timeout:g}s")
            time.sleep(poll)

    def launch(self, task: TaskLike | list[TaskLike] = None, *, command: str | None = None, detach: bool = True,
               num_jobs: int = 1,
               dryrun: bool = False, name: str | None = None, gpus: str | None = None, infra: str | None = None,
               num_nodes: int | None = None, cpus: str | None = None, memory: str | None = None,
               envs: Pairs = None, secrets: Pairs = None, time: str | None = None, base: Path | None = None,
               workdir: str | None = None, image_id: str | None = None, dev: bool = False,
               on_event: Callable[[dict[str, Any]], None] | None = None) -> Launched | list[list[PlanRow]]:
        """Launch a task on the cluster that can start it soonest: a task file's path, a YAML string, a
        task as a dict (or anything with `model_dump()`), or a list of them (one probe for all).

        The task's workdir and file_mounts are read here, relative to `base` (default: the current
        directory), and sent to the server. `num_jobs` > 1 is a sweep. With `dryrun`, nothing is
        submitted: returns each task's plan (with `dev`, a dev allocation's: places that cannot hold one
        are not feasible). With `detach=False`, returns once every job has ended.
        `on_event` sees the server's progress events (step, plan, skipped, submitted, warning) as they come.
        `workdir` replaces the task's (a local directory, sent as its workdir is); `image_id` its image.
        """
        if command is not None:
            inputs = [self._task_or_command(task, command, base, workdir)]  # refuses a task given as well
        else:
            inputs = [self._task_input(t, base, workdir) for t in (task if isinstance(task, list) else [task])]
        body = {"tasks": inputs, "num_jobs": num_jobs, "dryrun": dryrun, **({"dev": True} if dev else {}),
                "overrides": _overrides(name=name, gpus=gpus, infra=infra, num_nodes=num_nodes, cpus=cpus,
                                        memory=memory, envs=envs, secrets=secrets, time=time, workdir=workdir,
                                        image_id=image_id)}
        done = self._events("/launch", body, on_event)
        if dryrun:
            return [[PlanRow.from_json(r) for r in plan] for plan in done["plans"]]
        launched = Launched([[Submission.from_json(s) for s in shares] for shares in done["tasks"]])
        if detach:
            return launched
        return Launched(launched.tasks, [self.wait(job_id) for job_id in launched.job_ids])

    def sbatch(self, script: Path | str | None = None, *, wrap: str | None = None, text: str | None = None,
               options: list[str] | None = None, args: list[str] | None = None,
               dryrun: bool = False, managed: bool = False, infra: str | None = None, envs: Pairs = None,
               secrets: Pairs = None, workdir: str | None = None, base: Path | None = None,
               on_event: Callable[[dict[str, Any]], None] | None = None) -> Launched | list[list[PlanRow]] | list[str]:
        """Run an sbatch job script as it is, on the cluster that can start it soonest: `sbatch [options]
        script [args]`. Its `#SBATCH` lines (and `options`, which win) say what it needs; per cluster,
        Corral rewrites only the partition, the GPU type's spelling, and the profile's account and QOS.
        With `dryrun`, each plan row carries `script_diff` and `sbatch_command`. With `managed`, the
        controller recovers it (returns the job ids). Instead of a script's path: `wrap`, a command run in
        the sh script `sbatch --wrap` writes for it, or `text`, the script itself (as sbatch reads one on
        its standard input)."""
        task = self._script_input(script, options or [], args or [], base, workdir, wrap=wrap, text=text)
        overrides = _overrides(infra=infra, envs=envs, secrets=secrets, workdir=workdir)
        if managed and not dryrun:  # a dry run plans the same for both: nothing is recorded
            answer = self._json("POST", "/managed", body={"task": task, "overrides": overrides})
            for message in answer.get("warnings", []) if on_event else []:
                on_event({"event": "warning", "message": message})
            return list(answer["job_ids"])
        done = self._events("/launch", {"tasks": [task], "dryrun": dryrun, "overrides": overrides}, on_event)
        if dryrun:
            return [[PlanRow.from_json(r) for r in plan] for plan in done["plans"]]
        return Launched([[Submission.from_json(s) for s in shares] for shares in done["tasks"]])

    def _script_input(self, script: Path | str | None, options: list[str], args: list[str], base: Path | None,
                      workdir: str | None, *, wrap: str | None = None, text: str | None = None) -> dict[str, Any]:
        """The API's task for a job script: its text, name, sbatch options and arguments (and a workdir's
        files, when one is given)."""
        from corral.errors import TaskError

        if [script, wrap, text].count(None) != 2:
            raise TaskError("sbatch: give one of a job script's path, a command to wrap (wrap=...) or a "
                            "script's text (text=...)")
        if text is not None:
            text, source, file_name = text, "standard input", "sbatch"  # sbatch's name for such a job
        elif wrap is not None:
            if args:
                raise TaskError("sbatch: a wrapped command takes no script arguments (as sbatch --wrap)")
            from corral.sbatch_script import wrap_script

            text, source, file_name = wrap_script(wrap), "sbatch --wrap", "wrap"  # sbatch names such a job "wrap"
        else:
            from corral import taskfile

            path = Path(script)  # type: ignore[arg-type]
            text, source, file_name = taskfile.read_task_text(path, "job script"), str(path), path.name
        return {"source": source, "script": {"text": text, "file_name": file_name, "options": options,
                                             "args": args}, **self._workdir_files(workdir, base)}

    def managed_launch(self, task: TaskLike = None, *, command: str | None = None, num_jobs: int = 1,
                       name: str | None = None,
                       gpus: str | None = None, infra: str | None = None, num_nodes: int | None = None,
                       cpus: str | None = None, memory: str | None = None, envs: Pairs = None,
                       secrets: Pairs = None, base: Path | None = None, workdir: str | None = None,
                       image_id: str | None = None,
                       on_event: Callable[[dict[str, Any]], None] | None = None) -> list[str]:
        """Record managed jobs (recovered from failures, re-routed while pending); returns their ids.
        A task file (or YAML text) of several documents is a pipeline, as in SkyPilot: one managed job
        per task, each started once the one before it has succeeded (with `execution: parallel` in its
        header, a job group: its tasks run side by side on one cluster); the flags apply to every task,
        and `name` names the pipeline. `on_event` sees a `warning` event for each field of a task that
        has no meaning on Slurm, and for a pipeline a `pipeline` event with its `name`, `job_ids`,
        `execution` and (a job group's) `auxiliary` task ids."""
        body = {**self._managed_task(task, command, base, workdir), "num_jobs": num_jobs,
                "overrides": _overrides(name=name, gpus=gpus, infra=infra, num_nodes=num_nodes, cpus=cpus,
                                        memory=memory, envs=envs, secrets=secrets, workdir=workdir,
                                        image_id=image_id)}
        answer = self._json("POST", "/managed", body=body)
        for message in answer.get("warnings", []) if on_event else []:
            on_event({"event": "warning", "message": message})
        if on_event and answer.get("pipeline"):
            on_event({"event": "pipeline", "name": answer["pipeline"], "job_ids": list(answer["job_ids"]),
                      "execution": answer.get("execution", "serial"), "auxiliary": answer.get("auxiliary", [])})
        return list(answer["job_ids"])

    def managed_jobs(self, *, limit: int = 20, page: int = 1, all: bool = False, since: float | None = None
                     ) -> tuple[list[ManagedJob], int]:
        """Live managed jobs and the newest ended ones (launched since `since`, a Unix time, if given),
        newest first; and how many more ended ones."""
        data = self._json("GET", "/managed", {"limit": limit, "page": page, "all": all, "since": since})
        return [ManagedJob.from_json(j) for j in data["jobs"]], int(data["more"])

    def managed_job(self, job: str) -> dict[str, Any]:
        """One managed job as JSON, with its attempts' count and its events."""
        return self._json("GET", f"/managed/{_quoted(job)}")

    def managed_cancel(self, jobs: str | list[str] | None = None, *, all: bool = False, all_users: bool = False
                       ) -> list[CancelOutcome]:
        """Ask the controller to cancel managed jobs (one id or name, or a list); ended ones are reported
        as they are. `all`: every live managed job of yours; with `all_users` (admins), every user's."""
        data = self._json("POST", "/managed/cancel",
                          body={"jobs": _job_list(jobs), "all": all, "all_users": all_users})
        return [CancelOutcome(c["job_id"], bool(c["cancelling"]), status_of(ManagedJobStatus, c["state"]),
                              *_sweep_of(c)) for c in data["jobs"]]

    def managed_logs(self, job: str, attempt: int, follow: bool = False, *, tail: int = 0) -> Iterator[bytes]:
        """One attempt's output (its number: `managed_job(job)["attempt_list"]`; with `tail` > 0, its last
        `tail` lines first); with `follow`, until it ends."""
        yield from _cut_raised(self._stream("GET", f"/managed/{_quoted(job)}/attempts/{int(attempt)}/logs",
                                            {"follow": follow, "tail": tail or None}))

    def managed_why(self, job: str) -> list[str]:
        """Why a pending managed job waits where it is, as lines of text."""
        return list(self._json("GET", f"/managed/{_quoted(job)}/why")["lines"])

    def managed_wait(self, job: str, *, poll: float = 2.0, timeout: float | None = None) -> ManagedJob:
        """Until the managed job has ended (succeeded, failed or cancelled); returns it."""
        import time as clock

        deadline = None if timeout is None else clock.monotonic() + timeout
        while True:
            found = ManagedJob.from_json(self.managed_job(job))
            if found.ended:
                return found
            if deadline is not None and clock.monotonic() > deadline:
                raise CorralError(f"{job} still {found.state} after {timeout:g}s")
            clock.sleep(poll)

    # ---- who you are, and a team server's users -------------------------------------------------
    def me(self) -> dict[str, Any]:
        """Who this client's token stands for: name, role, Unix accounts per cluster."""
        return self._json("GET", "/me")

    def users(self) -> list[dict[str, Any]]:
        """A team server's users (admins only); never their tokens."""
        return list(self._json("GET", "/users")["users"])

    def add_user(self, name: str, *, role: str = "user", unix_users: dict[str, str] | None = None,
                 service: bool = False, expires_in_days: float | None = None) -> dict[str, Any]:
        """Add a user (admins only). The answer's `token` is shown this once: the server keeps its hash."""
        return self._json("POST", "/users", body={"name": name, "role": role, "unix_users": unix_users or {},
                                                  "service": service, "expires_in_days": expires_in_days})

    def dashboard_url(self) -> str:
        """A one-time login link to the server's dashboard, for this client's user (valid once, a minute)."""
        return self.endpoint.url.rstrip("/") + str(self._json("POST", "/dashboard/link")["path"])

    def set_unix_users(self, name: str, unix_users: dict[str, str]) -> dict[str, Any]:
        """Set a user's Unix account on each cluster (admins only; replaces their mapping)."""
        return self._json("PATCH", f"/users/{_quoted(name)}", body={"unix_users": unix_users})

    def remove_user(self, name: str) -> bool:
        """Remove a user (admins only): their token stops working at once. False if there was none."""
        return bool(self._json("DELETE", f"/users/{_quoted(name)}")["removed"])

    # ---- dev allocations ------------------------------------------------------------------------
    def dev_launch(self, name: str, task: TaskLike = None, *, command: str | None = None,
                   idle_minutes: float | None = None, walltime: str | None = None, wait: bool = True,
                   job_name: str | None = None, gpus: str | None = None, infra: str | None = None,
                   num_nodes: int | None = None, cpus: str | None = None, memory: str | None = None,
                   envs: Pairs = None, secrets: Pairs = None, base: Path | None = None, run: bool = False,
                   workdir: str | None = None, image_id: str | None = None,
                   default_idle_minutes: float | None = None, setup: bool = True, detach: bool = False,
                   on_event: Callable[[dict[str, Any]], None] | None = None,
                   on_output: Callable[[bytes], None] | None = None) -> dict[str, Any]:
        """Hold the dev allocation NAME (or reuse a live one of the same shape); with `wait`, until it is
        ready. Returns its cluster, partition, Slurm job id, whether it is `new`, and (ready) its nodes.
        With `run`, once it is ready (whatever `wait` says), the task's `run` runs in it (its output to
        `on_output`): `exit_code` and `job_id` say how it ended; with `detach` too, it returns once the
        run has started (`job_id`, `exit_code` None), as `sky launch -d`. A live allocation reused runs
        the task's `setup` again first (as `sky launch` on an existing cluster); `setup=False` runs no
        setup, there or in a new allocation.
        The idle limit: `idle_minutes`, else the task's `resources.autostop`, else
        `default_idle_minutes` (a user's setting), else none."""
        body = {"task": self._task_or_command(task, command, base, workdir), "idle_minutes": idle_minutes,
                "default_idle_minutes": default_idle_minutes,
                "walltime": walltime, "wait": wait, "run": run, "setup": setup, "detach": detach,
                "overrides": _overrides(name=job_name, gpus=gpus, infra=infra, num_nodes=num_nodes, cpus=cpus,
                                        memory=memory, envs=envs, secrets=secrets, workdir=workdir,
                                        image_id=image_id)}
        done = self._events(f"/dev/{_quoted(name)}", body, _output_to(on_output, on_event))
        return {k: v for k, v in done.items() if k != "event"}

    def dev_exec(self, name: str, task: TaskLike = None, *, command: str | None = None, envs: Pairs = None,
                 secrets: Pairs = None, base: Path | None = None, detach: bool = False, num_nodes: int | None = None,
                 gpus: str | None = None, cpus: str | None = None, memory: str | None = None,
                 infra: str | None = None, on_output: Callable[[bytes], None] | None = None,
                 on_event: Callable[[dict[str, Any]], None] | None = None) -> tuple[str, int | None]:
        """Run a task (or one command) on every node of allocation NAME; (job id, exit status). Its
        output goes to `on_output` as it comes; `on_event` gets `{"event": "started", "job_id": …}` first.
        Stopping (Ctrl-C) stops following, not the exec: `cancel(job_id)` ends it. `detach` (`sky exec
        -d`): return once it has started, with no exit status; `logs(job_id)` and `wait(job_id)` follow it.
        On an allocation not ready yet (detached or not) it is queued in the server until it is,
        `on_event` gets `{"event": "queued", "job_id": …, "allocation": …}` (the allocation's status),
        and the exit status is None: `wait(job_id)` or `logs(job_id, follow=True)` from there.
        `num_nodes` (or the task's): on that many of the allocation's nodes, as `sky exec`; else all.
        `gpus` (or the task's accelerators): that many of the allocation's GPUs per node for this job
        alone, waiting while other jobs hold them; `cpus`, `memory`, `infra` must fit what it holds."""
        body = {"task": self._task_or_command(task, command, base),
                "overrides": _overrides(envs=envs, secrets=secrets, num_nodes=num_nodes, gpus=gpus, cpus=cpus,
                                        memory=memory, infra=infra), "detach": detach}
        done = self._events(f"/dev/{_quoted(name)}/exec", body, _output_to(on_output, on_event))
        return str(done["job_id"]), None if done.get("exit_code") is None else int(done["exit_code"])

    def dev_status(self, names: list[str] | None = None) -> list[dict[str, Any]]:
        """Dev allocations (all, or those named): state, nodes, idle time, walltime left."""
        return list(self._json("GET", "/dev", {"name": names or []})["allocations"])

    def dev_autostop(self, names: list[str] | None, idle_minutes: float) -> tuple[list[dict[str, Any]],
                                                                                 list[dict[str, Any]]]:
        """Release the allocations named (None: all yours) once idle for `idle_minutes`, counted from now
        (0: never), as `sky autostop -i`. Returns (the statuses of those changed, with their new
        `idle_limit_seconds`; those not live, unchanged)."""
        data = self._json("PATCH", "/dev", body={"idle_minutes": idle_minutes, "names": names or []})
        return list(data["allocations"]), list(data["not_live"])

    def dev_down(self, name: str) -> bool:
        """Release allocation NAME; False if there was none."""
        return bool(self._json("DELETE", f"/dev/{_quoted(name)}")["released"])

    def dev_down_all(self) -> tuple[list[str], list[tuple[str, str]]]:
        """Release every allocation of yours: the names released, and (name, error) for any that could
        not be taken down."""
        data = self._json("DELETE", "/dev")
        return list(data["released"]), [(f["name"], f["error"]) for f in data["failed"]]

    def dev_ssh_argv(self, name: str, command: str | None = None) -> list[str]:
        """The ssh command line for a shell (or `command`) on NAME's head node (local server only)."""
        if not self.endpoint.local:
            raise CorralError("`corral ssh` needs the local server: a remote server's ssh keys are its own "
                              "(use `ssh NAME` with the alias the allocation's owner gets)")
        return list(self._json("GET", f"/dev/{_quoted(name)}/ssh", {"command": command})["argv"])

    # ---- tasks and their files ------------------------------------------------------------------
    def _task_or_command(self, task: TaskLike, command: str | None, base: Path | None,
                         workdir: str | None = None) -> dict[str, Any]:
        """The API's task for a task given (see `launch`) or one command line (`-- COMMAND`)."""
        if command is None:
            return self._task_input(task, base, workdir)
        if task is not None:
            raise TaskError("give either a task or a command, not both")
        return {"source": "command line", "run": command, **self._workdir_files(workdir, base)}

    def _managed_task(self, task: TaskLike, command: str | None, base: Path | None,
                      workdir: str | None) -> dict[str, Any]:
        """The API's `task` for a managed job, or its `pipeline` for a file (or YAML text) of several
        documents: each task with its own files."""
        from corral import taskfile

        if command is not None or task is None:
            return {"task": self._task_or_command(task, command, base, workdir)}
        read = _task_text(task)
        if read is None:  # `corral jobs launch train.sh`: a job script, run as sbatch would
            return {"task": self._script_input(Path(task), [], [], base, workdir)}
        text, source = read
        here = base or Path.cwd()
        found = taskfile.pipeline_tasks(text, source)
        if found is None:
            return {"task": self._text_input(text, source, taskfile.parse_yaml(text, source), here, workdir)}
        header, documents = found
        return {"pipeline": {**header, "tasks": [
            self._text_input(text, f"{source}, task {i}" + (f" ({data['name']})" if isinstance(data, dict)
                                                            and data.get("name") else ""), data, here, workdir)
            for i, (text, data) in enumerate(documents)]}}

    def _workdir_files(self, workdir: str | None, base: Path | None) -> dict[str, Any]:
        """`--workdir` without a task file: its files, sent as a task's workdir is."""
        if workdir is None:
            return {}
        from corral.sdk import files

        return {"files": self.send_files(files.task_files({"workdir": workdir}, base or Path.cwd()))}

    def _task_input(self, task: TaskLike, base: Path | None, workdir: str | None = None) -> dict[str, Any]:
        """The API's task: its text (or one command) and the uploads that stand for its local files;
        `workdir` (`--workdir`) in place of the task's."""
        from corral import taskfile

        here = base or Path.cwd()
        if task is None:
            return {"source": "command line", **self._workdir_files(workdir, base)}
        read = _task_text(task)
        if read is None:  # `corral launch script.sh`: run as sbatch would
            return self._script_input(Path(task), [], [], base, workdir)
        text, source = read
        return self._text_input(text, source, taskfile.parse_yaml(text, source), here, workdir)

    def _text_input(self, text: str, source: str, data: Any, here: Path, workdir: str | None) -> dict[str, Any]:
        """The API's task for YAML `text` (parsed: `data`), with the uploads of its local files."""
        from corral.sdk import files

        if workdir is not None and isinstance(data, dict):
            data = {**data, "workdir": workdir}
        return {"source": source, "yaml": text, "files": self.send_files(files.task_files(data, here))}

    def send_files(self, local: Any) -> dict[str, Any]:
        """Upload a task's local paths (`files.LocalFiles`), each once: content the server holds is not
        sent again."""
        from corral.sdk import files as _files

        sent: dict[str, Any] = {"file_mounts": {}}
        if local.workdir is not None:
            sent["workdir"] = self._upload(local.workdir, workdir=True)
            sent["workdir_origin"] = _files.origin(local.workdir)
        for remote, path in local.mounts.items():
            sent["file_mounts"][remote] = self._upload(path, workdir=False)
        return sent

    def _upload(self, path: Path, *, workdir: bool) -> str:
        from corral.sdk import files as _files

        packed = _files.pack(path, workdir=workdir)
        try:
            held = self._json("GET", f"/uploads/{packed.digest}")
            if not held["held"]:  # a server's own lower limit, named before anything is sent (it would
                # refuse mid-stream, and the client, still sending, would see only a reset connection)
                _files.within_limit(path, packed.size, held.get("max_bytes") or packed.size, "the server's ")
                with open(packed.archive, "rb") as f:
                    self._json("PUT", f"/uploads/{packed.digest}", body=f,
                               headers={"Content-Type": "application/x-tar", "Content-Length": str(packed.size)})
            return packed.digest
        finally:
            packed.archive.unlink(missing_ok=True)

    def _events(self, path: str, body: Any, on_event: Callable[[dict[str, Any]], None] | None) -> dict[str, Any]:
        """POST, then read the server's event stream to its `done` (returned) or `error` (raised)."""
        with self._request("POST", path, None, body, streamed=True) as response:
            for line in _lines(response, path):
                event = json.loads(line)
                kind = event.get("event")
                if kind == "done":
                    return event
                if kind == "error":
                    raise ApiError(str(event.get("message")), 400, str(event.get("kind") or ""),
                                   event.get("exit_code"))
                if on_event is not None:
                    on_event(event)
        raise _cut_off(path, EOFError("no final event"))

    # ---- transport ------------------------------------------------------------------------------
    def _request(self, method: str, path: str, query: dict[str, Any] | None, body: Any,
                 headers: dict[str, str] | None = None, *, streamed: bool = False) -> Any:
        """`streamed`: the answer's body is read for as long as it lasts (transport.opener)."""
        params = []
        for key, value in (query or {}).items():
            if value is None or value is False:
                continue
            for one in value if isinstance(value, list) else [value]:
                params.append((key, "true" if one is True else str(one)))
        point = self.endpoint
        url = f"{point.url}{API}{path}" + (f"?{urllib.parse.urlencode(params)}" if params else "")
        sent = {"Authorization": f"Bearer {point.token}", **(headers or {})}
        data = body if hasattr(body, "read") else json.dumps(body).encode() if body is not None else None
        if data is not None and "Content-Type" not in sent:
            sent["Content-Type"] = "application/json"
        request = urllib.request.Request(url, data=data, method=method, headers=sent)
        try:
            return _transport.opener(point, streamed=streamed).open(request, timeout=self.timeout)
        except urllib.error.HTTPError as exc:
            raise _api_error(exc) from None
        except (urllib.error.URLError, OSError) as exc:
            where = "the local Corral server" if point.local else point.url
            raise ServerUnreachableError(f"{where} did not answer: {getattr(exc, 'reason', exc)}"
                                         + (f"; {point.remedy}" if point.remedy else "")) \
                from None

    def _json(self, method: str, path: str, query: dict[str, Any] | None = None, body: Any = None,
              headers: dict[str, str] | None = None) -> Any:
        with self._request(method, path, query, body, headers) as response:
            raw = response.read()
        try:
            return json.loads(raw)
        except ValueError:
            raise ApiError(f"the server's answer to {path} is not JSON", 502) from None

    def _stream(self, method: str, path: str, query: dict[str, Any], lines: bool = False) -> Iterator[Any]:
        with self._request(method, path, query, None, streamed=True) as response:
            if lines:
                yield from _lines(response, path)
                return
            while True:
                try:
                    chunk = response.read1(65536)
                except (http.client.HTTPException, OSError) as exc:
                    raise _cut_off(path, exc) from None
                if not chunk:
                    return
                yield chunk


def _task_text(task: TaskLike) -> tuple[str, str] | None:
    """A task's YAML text and what to call it in errors; None for a path to a job script (run as sbatch
    would). `task`: a path, YAML text, a dict or an object with model_dump() (not None)."""
    from corral import taskfile

    if isinstance(task, Path) or (isinstance(task, str) and "\n" not in task and task.endswith((".yaml", ".yml"))):
        text = taskfile.read_task_text(Path(task))
        from corral.sbatch_script import is_batch_script

        return None if is_batch_script(text) else (text, str(task))
    if isinstance(task, str):
        return task, "task"
    import json

    data = task.model_dump(exclude_none=True) if hasattr(task, "model_dump") else task
    return json.dumps(data), "task"  # JSON is YAML


def _lines(response: Any, path: str) -> Iterator[bytes]:
    """The non-empty lines of a streamed answer; a server that dies mid-answer is a clear error."""
    try:
        for line in response:
            if line.strip():
                yield line
    except (http.client.HTTPException, OSError) as exc:
        raise _cut_off(path, exc) from None


_LONGEST_STREAM_ERROR = 16 * 1024  # a longer last line is the job's own


def _cut_raised(chunks: Iterator[bytes]) -> Iterator[bytes]:
    """A log stream's chunks as they come, but for the line by which the server says it could not read
    on (errors.stream_error_line): raised as OutputCutError once everything before it is out. A last
    line that may be becoming that line is held until the next chunk shows what it is."""
    held = b""
    for chunk in chunks:
        data = held + chunk
        start = data.rfind(b"\n", 0, len(data) - 1) + 1  # where the last line begins
        last = data[start:]
        maybe = last.startswith(STREAM_ERROR) or STREAM_ERROR.startswith(last)
        held = last if maybe and len(last) <= _LONGEST_STREAM_ERROR else b""
        if out := data[:len(data) - len(held)]:
            yield out
    said = read_stream_error(held) if held else None
    if said is not None:
        message, kind, exit_code = said
        raise OutputCutError(message, 200, kind, exit_code)
    if held:
        yield held


def _cut_off(path: str, exc: BaseException) -> ServerUnreachableError:
    return ServerUnreachableError(f"the server stopped answering {API}{path} midway ({type(exc).__name__}); "
                                  "what it had started may have finished: `corral queue` shows it")


def _output_to(on_output: Callable[[bytes], None] | None,
               on_event: Callable[[dict[str, Any]], None] | None) -> Callable[[dict[str, Any]], None]:
    """A job's `output` events (base64) decoded to `on_output`; the other events to `on_event`."""
    import base64

    def event(e: dict[str, Any]) -> None:
        if e.get("event") == "output":
            if on_output is not None:
                on_output(base64.b64decode(e["data"]))
        elif on_event is not None:
            on_event(e)

    return event


def _job_list(jobs: str | list[str] | None) -> list[str]:
    """One job or a list of them: `cancel("c-1a2b")` had sent each of its characters as a job."""
    return [jobs] if isinstance(jobs, str) else list(jobs or [])


def _sweep_of(outcome: dict[str, Any]) -> tuple[str | None, int]:
    """A cancel's word on the sweep a job named by its id is the first of (CancelOutcome.sweep_name)."""
    sweep = outcome.get("sweep") or {}
    return sweep.get("name"), int(sweep.get("jobs") or 0)


def _quoted(ref: str) -> str:
    return urllib.parse.quote(ref, safe="")


def _pairs(values: Pairs, what: str) -> list[str]:
    """KEY=VALUE items; a bare KEY takes its value from this process's environment (as `--secret KEY`)."""
    if values is None:
        return []
    if isinstance(values, dict):
        return [f"{k}={v}" for k, v in values.items()]
    out = []
    for item in values:
        if "=" not in item:
            if item not in os.environ:
                raise TaskError(f"{what} {item!r}: {item} is not set in your environment; give {item}=VALUE")
            item = f"{item}={os.environ[item]}"
        out.append(item)
    return out


def _overrides(*, name: str | None = None, gpus: str | None = None, infra: str | None = None,
               num_nodes: int | None = None, cpus: str | None = None, memory: str | None = None,
               envs: Pairs = None, secrets: Pairs = None, time: str | None = None, workdir: str | None = None,
               image_id: str | None = None) -> dict[str, Any]:
    """The API's overrides; a bare KEY in `envs` or `secrets` takes its value from this process's
    environment (`--env KEY`, `--secret KEY`), as SkyPilot does."""
    given = {"name": name, "gpus": gpus, "infra": infra, "num_nodes": num_nodes, "cpus": cpus, "memory": memory,
             "time": time, "workdir": workdir, "image_id": image_id}
    out: dict[str, Any] = {k: v for k, v in given.items() if v is not None}
    out["envs"] = _pairs(envs, "--env")
    out["secrets"] = _pairs(secrets, "--secret")
    return out


def _api_error(exc: urllib.error.HTTPError) -> ApiError:
    try:
        body = json.loads(exc.read() or b"{}")
    except ValueError:
        body = {}
    detail = body.get("detail") if isinstance(body, dict) else None
    kind, exit_code = "", None
    if isinstance(detail, dict):  # a CorralError the server raised: its message, class and exit code
        detail, kind, exit_code = detail.get("message"), str(detail.get("kind", "")), detail.get("exit_code")
    if isinstance(detail, list):  # FastAPI's validation errors: name the fields
        parts = [f"{'.'.join(str(x) for x in d.get('loc', [])[1:])}: {d.get('msg')}" for d in detail
                 if isinstance(d, dict)]
        detail = "; ".join(parts) or None
    if exc.code >= 500:
        detail = (f"the server failed ({detail or exc.reason}): a bug in Corral; its log says why "
                  "(a local server's is controller.log in CORRAL_HOME)")
    if exc.code == 401:
        detail = f"{detail or 'unauthorized'} (the server refused the token; `corral api login URL --token ...`)"
    if exc.code == 401:
        exit_code = EXIT_NOPERM
    elif exc.code == 422:
        exit_code = EXIT_DATAERR
    return ApiError(str(detail or f"HTTP {exc.code} {exc.reason}"), exc.code, kind, exit_code)


__all__ = ["ApiError", "CancelOutcome", "Client", "ClusterCheck", "GpuReport", "GpuRow", "Job", "JobStatus",
           "Launched", "ManagedJob", "ManagedJobStatus", "OutputCutError", "PlanRow", "QueuePage",
           "ServerUnreachableError", "Submission", "Unreachable"]
