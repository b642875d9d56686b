"""`corral launch`: probe, plan, predict, submit with failover, record; over the Infra seam only.

Submission is idempotent: each attempt's token is written to the state store before anything reaches
the infra, which puts it on the job (on Slurm, the job name `corral-<token>`). If the process dies
between the submission and recording the job's handle, the next refresh finds the job by its token
and adopts it; a retried submit of the same attempt finds it too and does not submit twice.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import os
import time
from abc import ABC, abstractmethod
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal

from corral.budget import affords_now
from corral.client import Client, ProbeOutcome
from corral.config import NOT_SET_UP, infra_order
from corral.errors import (
    ClusterError,
    CorralError,
    UnavailableError,
    UnknownPartitionError,
    listed,
)
from corral.infra import caches
from corral.infra.base import (
    FailureClass,
    HoldsAllocations,
    HostsJobGroups,
    Infra,
    JobRequest,
    JobState,
    PredictsStart,
    RunsArrays,
    RunsJobScripts,
    SubmitResult,
    new_token,
)
from corral.liveness import Sending, process_tag
from corral.periodic import repeating
from corral.placement import Candidate, Plan, build_plan, holding_runtime, slurm_minutes
from corral.profiles import RunSettings, apply_profiles, with_prefix
from corral.script_task import (
    copy_indices,
    script_constraint,
    script_copies,
    script_nodes,
    script_partitions,
    without_excluded,
)
from corral.state import Store
from corral.state.models import AttemptRow, JobRow
from corral.state.sealed import seal, unseal
from corral.task import (
    ResourceOption,
    Task,
    TaskError,
    job_environment,
    redacted_json,
    resolved_envs,
    resolved_secrets,
    resource_options,
)
from corral.taskfile import MAX_SWEEP_JOBS, check_num_jobs  # noqa: F401 - re-exported
from corral.uploads import cache_key

Prediction = Literal["all", "when_full", "never"]

CRASH_HOOK_ENV = "CORRAL_TEST_CRASH_AFTER_SBATCH"  # tests only: die between sbatch and the DB write
# Tests only: on this cluster, sbatch's answer is lost after Slurm accepted the job (a dropped connection).
LOST_ANSWER_HOOK_ENV = "CORRAL_TEST_LOSE_SUBMIT_ANSWER"
# While a submission runs (its files on the way, then the submission proper, which an SSH pool's copy is
# part of), its attempts' created_at is restamped this often (one store write each time): another
# process's tracker (a replica's) counts its grace (SUBMIT_GRACE_SECONDS) from there, so it never settles
# an attempt a live replica is still sending, and settles one whose sender died within the grace.
RESTAMP_AFTER_SECONDS = 10.0


class NoFeasibleClusterError(UnavailableError):
    pass


class LaunchFailedError(UnavailableError):
    pass


@dataclass(frozen=True)
class Submitted:
    job_ids: list[str]
    cluster: str
    partition: str
    handle: str  # the infra's (a Slurm job id; an array's id for a sweep's share)
    log_path: str
    tries: list[tuple[str, str]]  # (infra, why it was skipped)
    handles: list[str] = field(default_factory=list)  # one per job: its array task's handle in a share
    infra: str = ""  # where: slurm/<cluster>/<partition>, ssh/<pool>


@dataclass
class Failover:
    """The walk along ranked candidates until one cluster's sbatch accepts. A rejection moves on to
    the next candidate at once; an unreachable cluster is skipped with all its partitions (`dead` may
    be shared by submissions running side by side)."""

    dead: set[str] = field(default_factory=set)
    tries: list[tuple[str, str]] = field(default_factory=list)  # (infra, why it was skipped)

    async def first_accepting(
            self, candidates: list[Candidate], submit: Callable[[Candidate], Awaitable[SubmitResult]],
            skipped: Callable[[Candidate, str, FailureClass], None]) -> tuple[Candidate, SubmitResult] | None:
        """`skipped` learns why, and whether the infra refused the job (REJECTED: it holds no copy) or
        did not answer (LOST: it may hold one, which the tracker watches for)."""
        for candidate in candidates:
            if candidate.cluster in self.dead:
                continue
            try:
                result = await submit(candidate)
            except ClusterError as exc:
                self.dead.add(candidate.cluster)
                why, failure = str(exc), FailureClass.LOST
            else:
                if result.accepted:
                    return candidate, result
                why, failure = f"{candidate.cluster}: {result.message}", FailureClass.REJECTED
            self.tries.append((candidate.infra, why))
            skipped(candidate, why, failure)
        return None

    def summary(self) -> str:
        return "; ".join(f"{infra}: {why}" for infra, why in self.tries)


@dataclass
class LaunchEvents:
    """Callbacks the CLI uses to tell the user what is happening; all optional."""

    step: Callable[[str, str], None] = lambda step, detail: None  # probe, plan, sync, submit: what it does now
    plan: Callable[[Plan], None] = lambda plan: None
    skipped: Callable[[str, str], None] = lambda infra, why: None
    submitted: Callable[[Submitted], None] = lambda submitted: None


@dataclass(frozen=True)
class AttemptOptions:
    """What differs between a plain job's submission and a managed job's later attempts."""

    first_number: int = 1  # attempt number of the first try (failover tries count up from it)
    extra_env: dict[str, str] = field(default_factory=dict)
    requeue: bool = True  # may the infra requeue the job itself (managed jobs: no, the controller recovers)
    held: bool = False  # submitted held, released later (a managed job's move)
    checkpoint_dir: str | None = None
    carried: tuple[CarriedFolder, ...] = ()  # folders the attempts take along (a recovered job's checkpoint)


class CarriedFolder(ABC):
    """A folder a job's new attempt takes along from the cluster the job ran on before (`source`): a
    managed job's checkpoint, sent with the attempt to `remote` on whichever cluster the submission
    lands, unless that is `source`."""

    def __init__(self, job_id: str, source: str, remote: str) -> None:
        self.job_id, self.source, self.remote = job_id, source, remote

    @abstractmethod
    async def carry(self, target: Infra, place: str, token: str) -> None:
        """Send the folder to `remote` on `target` (the place named `place`), for the submission `token`.
        A failure of the target raises (the submission fails over); one of the source is the folder's
        own story."""


@dataclass
class Launcher:
    client: Client
    store: Store
    events: LaunchEvents = field(default_factory=LaunchEvents)
    owner: str = ""  # the user the jobs it records belong to (controller/auth.py)
    # Clusters known slow to answer, with why (tracker.left_out): the server's API passes the clusters
    # whose status query is overdue, so that a launch does not wait for them.
    slow: dict[str, str] = field(default_factory=dict)

    async def probe_for(self, tasks: list[Task], slow: dict[str, str] | None = None) -> list[ProbeOutcome]:
        """One probe of every cluster any of the tasks may run on. `slow` (default: the launcher's): clusters
        known slow to answer, with why, left out where a task may run anywhere; one a task names is asked."""
        # Each distinct task once: a sweep's jobs share one parsed task (engine._parse_task).
        options = [o for task in {id(t): t for t in tasks}.values() for o in resource_options(task.resources)]
        pinned = {o.infra.cluster for o in options}
        for cluster in pinned - {None}:
            self.client.registry.get(cluster)  # an unknown name fails here, naming the known ones
        clusters = self._places_for(options)
        if clusters == []:  # only kinds with no place set up (`--infra k8s` without contexts): nothing to ask
            return []
        paths = {p for o in options for p in o.paths}
        # Under load, a snapshot up to half a minute old rather than a wait for the budget (client.py).
        slow = self.slow if slow is None else slow
        left_out = {c: why for c, why in slow.items() if c not in pinned and (clusters is None or c in clusters)
                    } if None in pinned else {}
        return await self.client.probe(clusters, paths=tuple(sorted(paths)), reuse_when_busy=True,
                                       leave_out=left_out)

    def _places_for(self, options: list[ResourceOption]) -> list[str] | None:
        """The places these options may run on, in the cluster file's order; None: every place. An
        option of one kind (`--infra k8s`) asks only the places of that kind, not every cluster."""
        kinds = {o.infra.kind for o in options if o.infra.cluster is None}
        if "" in kinds:
            return None
        pinned = {o.infra.cluster for o in options}
        of_kinds = set(self.client.registry.names_of(*kinds))
        return [c for c in self.client.registry.names() if c in pinned or c in of_kinds]

    async def plan(self, task: Task, *, predict: Prediction, outcomes: list[ProbeOutcome] | None = None,
                   owner: str | None = None, holding: bool = False, grouped: bool = False) -> Plan:
        """Where the task can run, ranked. `predict`: ask Slurm for start times (`sbatch --test-only`) of
        every candidate that cannot start now ("all"), only when none can ("when_full"), or not at all.
        On a team server, for `owner` (default: the launcher's): clusters where they have no account are
        left out, with the reason. `holding`: the plan of a dev allocation, where a place whose infra
        cannot hold one is not feasible, and says so; `grouped`, of a job group's task, likewise where
        its infra cannot run one (HostsJobGroups)."""
        owner = self.owner if owner is None else owner
        options = resource_options(task.resources)
        if outcomes is None:
            outcomes = await self.probe_for([task])
        places = self._places_for(options)  # a probe shared with other tasks asked other places too
        relevant = [o for o in outcomes if places is None or o.cluster in places]
        refused = {o.cluster: why for o in relevant if (why := self.client.refusal(owner, o.cluster))}
        snapshots = {o.cluster: o.snapshot for o in relevant if o.snapshot and o.cluster not in refused}
        probed = snapshots
        if task.slurm.script is not None:
            snapshots = without_excluded(task, snapshots)  # `-x`: Slurm will not use those nodes
        unreachable = {o.cluster: o.error_message or "" for o in relevant if o.snapshot is None}
        unreachable.update(refused)
        order = [o.cluster for o in outcomes]
        plan = apply_profiles(build_plan(task, options, snapshots, order, unreachable, infra_order(),
                                         self._constraint_at(task)), task, self.client.profiles)
        plan.kinds = {c: kind for c in unreachable if (kind := self.client.registry.infra_kind(c)) != "slurm"}
        set_up = {self.client.registry.infra_kind(c) for c in self.client.registry.names()}
        plan.not_set_up = sorted({o.infra.kind for o in options if o.infra.kind and not o.infra.cluster} - set_up)
        if task.slurm.script is not None:
            plan = script_nodes(script_partitions(plan, task), task, probed)
        for option in options:
            sel = option.infra
            if sel.partition and sel.cluster in snapshots and not any(
                    c.cluster == sel.cluster and c.partition == sel.partition for c in plan.candidates):
                raise UnknownPartitionError(sel.cluster, sel.partition,
                                            [p.name for p in snapshots[sel.cluster].partitions])
        if holding:
            plan.candidates = [c if not c.feasible or isinstance(self.client.infra(c.cluster, owner), HoldsAllocations)
                               else c.refused(CANNOT_HOLD)
                               for c in plan.candidates]
            plan.candidates = [holding_runtime(c, snapshots[c.cluster]) if c.cluster in snapshots else c
                               for c in plan.candidates]
        if grouped:
            plan.candidates = [c if not c.feasible or (why := self._group_refusal(c.cluster, owner)) is None
                               else c.refused(why)
                               for c in plan.candidates]
        feasible = plan.feasible()
        if predict == "all" or (predict == "when_full" and feasible and not any(c.startable_now for c in feasible)):
            await self.predict([(task, plan)], owner=owner)
        now = time.time()
        short = {c.cluster for c in plan.candidates if c.startable_now and not affords_now(c.cluster, 1)}
        plan.candidates = [replace(c.with_prediction(now, "can start now"), budget_short=c.cluster in short)
                           if c.startable_now else c for c in plan.candidates]
        return plan

    def _group_refusal(self, cluster: str, owner: str) -> str | None:
        """Why `cluster` cannot run a job group's task (None: it can)."""
        infra = self.client.infra(cluster, owner)
        return infra.job_group_refusal() if isinstance(infra, HostsJobGroups) else CANNOT_GROUP

    def _constraint_at(self, task: Task) -> Callable[[str, str], str | None]:
        """Where the task would be submitted with which `--constraint`: a script's own everywhere (its
        profile does not add one); a task's `slurm.constraint` over its cluster profile's."""
        if task.slurm.script is not None:
            constraint = script_constraint(task)
            return lambda cluster, partition: constraint
        profiles = self.client.profiles
        return lambda cluster, partition: profiles.settings(cluster, partition, task).scheduler_options.get(
            "constraint")

    async def predict(self, plans: list[tuple[Task, Plan]], owner: str | None = None) -> None:
        """Predicted starts (`sbatch --test-only`, as `owner`: their account's limits) for the feasible
        candidates that cannot start now, for several tasks at once: one round trip per cluster, whatever
        the number of tasks."""
        owner = self.owner if owner is None else owner
        by_cluster: dict[str, list[tuple[int, Candidate]]] = {}
        for index, (_task, plan) in enumerate(plans):
            for c in plan.feasible():
                if not c.startable_now:
                    by_cluster.setdefault(c.cluster, []).append((index, c))

        async def one(cluster: str, group: list[tuple[int, Candidate]]) -> list[tuple[float | None, str]]:
            infra = self.client.infra(cluster, owner)
            if not isinstance(infra, PredictsStart):
                return [(None, f"{infra.name} does not predict start times")] * len(group)
            requests = [self.job_request(plans[i][0], c, "testonly0000", ("c-test",), {}) for i, c in group]
            try:
                return await infra.predict(requests)
            except CorralError as exc:
                return [(None, f"prediction failed: {exc}")] * len(group)

        answers = await asyncio.gather(*(one(k, v) for k, v in by_cluster.items()))
        results: list[dict[tuple[str, str], tuple[float | None, str]]] = [{} for _ in plans]
        for group, group_answers in zip(by_cluster.values(), answers):
            for (index, c), answer in zip(group, group_answers):
                results[index][(c.cluster, c.partition)] = answer
        for (_task, plan), found in zip(plans, results):
            plan.candidates = [c.with_prediction(*found[(c.cluster, c.partition)])
                               if (c.cluster, c.partition) in found else c for c in plan.candidates]

    @staticmethod
    def job_request(task: Task, candidate: Candidate, token: str, job_ids: tuple[str, ...],
                    envs: dict[str, str], first_rank: int = 0, num_jobs: int = 1,
                    options: AttemptOptions | None = None) -> JobRequest:
        """The generic request for one submission of `task` to `candidate`."""
        options = options or AttemptOptions()
        option = candidate.option
        settings = candidate.runs_with or RunSettings(task.slurm.model_dump(exclude_none=True, exclude={"script"}))
        prefix = settings.prefix()
        scheduler_options = dict(settings.scheduler_options)
        limit = scheduler_options.get("time")
        walltime = slurm_minutes(str(limit)) if limit is not None else None
        indices: tuple[int, ...] = ()
        if task.slurm.script is not None:  # run as it is: the profile's paths and env go to its environment
            scheduler_options["script"] = task.slurm.script.model_dump()
            scheduler_options["script_paths"] = dict(settings.paths)
            prefix = ""
            every = copy_indices(task)
            indices = tuple(every[first_rank:first_rank + len(job_ids)]) if every else ()
        if candidate.kind == "k8s":  # the task's own section for Kubernetes (pod_config), as in SkyPilot
            scheduler_options = dict((task.config or {}).get("kubernetes") or {})
        return JobRequest(
            token=token,
            task_ids=job_ids,
            place=candidate.partition,
            num_nodes=task.num_nodes,
            accelerator_type=candidate.gres_type,
            accelerators_per_node=option.accelerator.count if option.accelerator else 0,
            cpus_per_node=math.ceil(option.cpus.value) if option.cpus else None,
            memory_mb=math.ceil(option.memory_gb.value * 1024) if option.memory_gb else None,
            envs={**settings.env, **envs},
            setup=with_prefix(prefix, task.setup),
            run=with_prefix(prefix, task.run),
            first_rank=first_rank,
            num_jobs=num_jobs,
            extra_env=dict(options.extra_env),
            checkpoint_dir=options.checkpoint_dir,
            scheduler_options=scheduler_options,
            requeue=options.requeue,
            held=options.held,
            container_image=option.image_id.removeprefix("docker:") if option.image_id else None,
            container_runtime=candidate.container_runtime,
            copy_indices=indices,
            time_limit_seconds=round(walltime * 60) if walltime is not None and math.isfinite(walltime) else None,
        )

    async def launch(self, task: Task, source: str, *, num_jobs: int = 1) -> list[Submitted]:
        """Submit `num_jobs` copies of the task (one for a plain launch); returns one entry per share."""
        [shares] = await self.launch_many([(task, source)], num_jobs=num_jobs)
        return shares

    async def launch_many(self, tasks: list[tuple[Task, str]], *, num_jobs: int = 1) -> list[list[Submitted]]:
        """Launch several task files at once: one probe round trip per cluster for all of them, then
        their submissions side by side. Returns, per task, one entry per share."""
        check_num_jobs(num_jobs)
        num_jobs = script_copies(tasks, num_jobs)
        envs = [job_environment(task, source) for task, source in tasks]  # all checked before any is sent
        for task, _ in tasks:
            self.check_local_files(task)
        self.events.step("probe", "asking the clusters for their free capacity")
        outcomes = await self.probe_for([task for task, _ in tasks])
        self.events.step("plan", "ranking where the task can start soonest")
        plans = [await self.plan(task, predict="when_full", outcomes=outcomes) for task, _ in tasks]
        for (_task, source), plan in zip(tasks, plans):  # all or nothing: check before submitting any
            if not plan.feasible():
                prefix = f"{source}: " if len(tasks) > 1 else ""
                raise NoFeasibleClusterError(prefix + no_candidate_message(plan))
        return list(await asyncio.gather(*(
            self._launch_planned(task, task_envs, plan, num_jobs)
            for (task, _), task_envs, plan in zip(tasks, envs, plans)
        )))

    async def _launch_planned(self, task: Task, envs: dict[str, str], plan: Plan, num_jobs: int) -> list[Submitted]:
        """A sweep is split over the candidates that can start copies now, in rank order, and whatever
        is left goes to the best one; each share is one Slurm job array, so a 300-job sweep is a
        handful of sbatch calls, not 300."""
        self.events.plan(plan)
        feasible = plan.feasible()
        if not feasible:
            raise NoFeasibleClusterError(no_candidate_message(plan))
        sealed = seal(resolved_secrets(task, "task"))
        ids, now = self.store.new_job_ids(num_jobs), time.time()
        sweep = ids[0] if num_jobs > 1 else None  # a sweep's jobs share it, and their creation time
        jobs = [JobRow(id=job_id, name=task.name or "task", task_json=redacted_json(task), secrets_sealed=sealed,
                       created_at=now, job_rank=i, num_jobs=num_jobs, sweep_id=sweep, submitter=process_tag(),
                       owner=self.owner)
                for i, job_id in enumerate(ids)]
        self.store.add_jobs(jobs, [])
        return await self.submit_jobs(task, envs, feasible, jobs)

    async def submit_jobs(self, task: Task, envs: dict[str, str], feasible: list[Candidate],
                          jobs: list[JobRow], options: AttemptOptions | None = None) -> list[Submitted]:
        """New attempts for recorded jobs of one task (contiguous ranks): split into shares, one array each.
        A job script's own array is never split: it goes whole, as its --array says."""
        if task.slurm.script is not None:
            shares = [(feasible[0], 0, len(jobs))]
        else:
            shares = [(candidate, start + offset, min(limit, count - offset))
                      for candidate, start, count in split_sweep(feasible, len(jobs))
                      for limit in [self._array_limit(candidate.cluster)]
                      for offset in range(0, count, limit)]
        dead: set[str] = set()
        results = await asyncio.gather(*(
            self._submit_share(task, envs, feasible, jobs[start:start + count], first, dead,
                               options or AttemptOptions())
            for first, start, count in shares
        ))
        return list(results)

    def _array_limit(self, cluster: str) -> int:
        infra = self.client.infra(cluster)
        return infra.max_array_size if isinstance(infra, RunsArrays) else 1

    async def _submit_share(self, task: Task, envs: dict[str, str], feasible: list[Candidate],
                            jobs: list[JobRow], first: Candidate, dead: set[str],
                            options: AttemptOptions) -> Submitted:
        """Submit one share (one job, or one array), failing over along the ranked candidates. Its
        attempts are not settled as never sent while it runs, however long their files take (Sending)."""
        with Sending() as sending:
            return await self._send_share(task, envs, feasible, jobs, first, dead, options, sending)

    async def _send_share(self, task: Task, envs: dict[str, str], feasible: list[Candidate], jobs: list[JobRow],
                          first: Candidate, dead: set[str], options: AttemptOptions, sending: Sending) -> Submitted:
        job_ids = tuple(j.id for j in jobs)
        numbers = itertools.count(options.first_number)
        tried: dict[int, tuple[JobRequest, list[AttemptRow]]] = {}  # by id(candidate)

        async def submit(candidate: Candidate) -> SubmitResult:
            number = next(numbers)
            token = new_token()
            infra = self.client.infra(candidate.cluster, jobs[0].owner)  # as the jobs' owner (accounts.py)
            request = self.job_request(task, candidate, token, job_ids, envs, first_rank=jobs[0].job_rank,
                                       num_jobs=jobs[0].num_jobs, options=options)
            files = infra.attempt_files(request)
            attempts = [
                AttemptRow(token=token if not request.is_array else f"{token}.{request.copy_index(i)}", job_id=jid,
                           number=number,
                           cluster=candidate.cluster, partition=candidate.partition, state=JobState.SUBMITTING,
                           created_at=time.time(), run_dir=files.run_dir, log_path=files.log_paths[i],
                           error_path=files.error_paths[i] if files.error_paths else None, submitter=process_tag(),
                           held=request.held or None)
                for i, jid in enumerate(job_ids)
            ]
            tried[id(candidate)] = (request, attempts)
            sending.add(a.token for a in attempts)
            self.store.add_jobs([], attempts)
            carried = [f for f in options.carried if f.job_id in job_ids and f.source != candidate.cluster]
            if task.workdir or task.file_mounts or carried:
                self.events.step("sync", f"copying the task's files to {candidate.infra}")
            async with repeating(RESTAMP_AFTER_SECONDS, lambda: self._mark(attempts, created_at=time.time())):
                await self.upload_files(task, infra, files.run_dir, token)
                for folder in carried:
                    await folder.carry(infra, candidate.cluster, token)
                self.events.step("submit", f"submitting to {candidate.infra}")
                result = await infra.submit(request)
            if result.accepted and os.environ.get(LOST_ANSWER_HOOK_ENV) == candidate.cluster:
                raise ClusterError(candidate.cluster, "no answer (test hook: the answer was lost)")
            return result

        def skipped(candidate: Candidate, why: str, failure: FailureClass) -> None:
            if id(candidate) in tried:
                self._mark(tried[id(candidate)][1], state=JobState.SUBMIT_FAILED, reason=why, failure=failure.value,
                           ended_at=time.time())
            self.events.skipped(candidate.infra, why)

        failover = Failover(dead)
        accepted = await failover.first_accepting([first] + [c for c in feasible if c is not first], submit, skipped)
        if accepted is None:
            raise LaunchFailedError(f"no cluster accepted the job ({failover.summary()})")
        candidate, result = accepted
        request, attempts = tried[id(candidate)]
        if os.environ.get(CRASH_HOOK_ENV):
            os._exit(137)
        assert result.handle is not None
        infra = self.client.infra(candidate.cluster, jobs[0].owner)
        now = time.time()
        handles = [infra.array_handle(result.handle, request.copy_index(i))
                   if request.is_array and isinstance(infra, RunsArrays)
                   else result.handle for i in range(len(attempts))]
        self.store.accept_attempts({a.token: handle for a, handle in zip(attempts, handles)}, now)
        submitted = Submitted(list(job_ids), candidate.cluster, candidate.partition, result.handle,
                              attempts[0].log_path, failover.tries, handles, candidate.infra)
        self.events.submitted(submitted)
        return submitted

    def _mark(self, attempts: list[AttemptRow], **fields: object) -> None:
        self.store.update_attempts({a.token: dict(fields) for a in attempts})

    @staticmethod
    def check_local_files(task: Task) -> None:
        """The engine reads a task's files from absolute paths on its own machine only: those the server
        unpacked from what the client sent (`corral.uploads`), never relative to its working directory."""
        paths = ([("workdir", task.workdir)] if task.workdir else []) + [
            (f"file_mounts[{remote!r}]", local) for remote, local in task.file_mounts.items()]
        for what, path in paths:
            if not os.path.isabs(path):
                raise TaskError(f"{what}: {path!r} reached the engine as a relative path; its files must be "
                                "sent with the task (corral.sdk does)")
            if not os.path.exists(path):
                raise TaskError(f"{what}: {path!r} does not exist (any more) on the server")

    def script_previews(self, task: Task, plan: Plan) -> dict[tuple[str, str], tuple[str, str]]:
        """For `--dryrun` of a job script: per feasible (cluster, partition), the script as it would be
        received there and sbatch's command line (pure)."""
        if task.slurm.script is None:
            return {}
        copies = len(copy_indices(task) or (0,))
        out = {}
        for c in plan.feasible():
            infra = self.client.infra(c.cluster, self.owner)
            if isinstance(infra, RunsJobScripts):
                request = self.job_request(task, c, "000000000000", tuple(f"c-{i}" for i in range(copies)), {})
                out[(c.cluster, c.partition)] = infra.script_for(request)
        return out

    async def transfer_sizes(self, task: Task, plan: Plan) -> dict[str, int]:
        """For `--dryrun`: per feasible cluster, the bytes a launch there would send: the workdir as that
        cluster's cache lacks it (an rsync dry run, one session per cluster, in parallel), plus the
        file_mounts whole (objects as the store lists them)."""
        from corral import buckets

        mounts = await asyncio.to_thread(buckets.transfer_bytes, task.model_copy(update={"workdir": None}))
        whole = await asyncio.to_thread(buckets.source_size, task.workdir) if task.workdir else 0
        clusters = sorted({c.cluster for c in plan.feasible()})

        async def one(cluster: str) -> int:
            if not task.workdir:
                return 0
            try:
                found = await self.client.infra(cluster, self.owner).workdir_upload_size(
                    Path(task.workdir), cache_key(task.workdir))
            except CorralError:
                found = None
            return whole if found is None else found

        return {c: mounts + size for c, size in zip(clusters, await asyncio.gather(*(one(c) for c in clusters)))}

    async def upload_files(self, task: Task, infra: Infra, run_dir: str, token: str | None = None) -> None:
        """The task's workdir (through the cluster-side cache) and file_mounts, for a job in `run_dir`
        (submitted as `token`: the files go with that submission)."""
        if task.workdir:
            key = cache_key(task.workdir)
            async with caches.cache_lock(infra.name, key):
                await infra.upload_workdir(Path(task.workdir), key, f"{run_dir}/workdir")
        for remote, local in task.file_mounts.items():
            if remote.startswith("/") or remote.startswith("~/"):
                destination = remote.removeprefix("~/")
            else:
                destination = f"{run_dir}/workdir/{remote}"
            await infra.upload(Path(local), destination, token)


def recorded_environment(job: JobRow, task: Task, source: str) -> dict[str, str]:
    """What a recorded job's environment gets: its task's envs, then its secrets unsealed from the
    store (sealed apart when it was recorded; a sweep's jobs share both)."""
    return {**resolved_envs(task, source), **unseal(job.secrets_sealed)}


def split_sweep(feasible: list[Candidate], num_jobs: int) -> list[tuple[Candidate, int, int]]:
    """(candidate, first rank, count) shares: fill what can start now in rank order, rest to the best."""
    shares: list[tuple[Candidate, int, int]] = []
    remaining, rank = num_jobs, 0
    for candidate in feasible:
        if remaining == 0:
            break
        take = min(remaining, candidate.startable_copies)
        if take:
            shares.append((candidate, rank, take))
            rank += take
            remaining -= take
    if remaining:
        best = feasible[0]
        if shares and shares[-1][0] is best:
            shares[-1] = (best, shares[-1][1], shares[-1][2] + remaining)
        else:
            shares.append((best, rank, remaining))
    return shares


def not_set_up_reasons(plan: Plan) -> list[str]:
    return [f"infra {kind}: {NOT_SET_UP.get(kind, 'not set up')}" for kind in plan.not_set_up]


CANNOT_HOLD = "cannot hold a dev allocation yet (Slurm clusters and SSH pools can)"
CANNOT_GROUP = ("cannot run a job group's tasks yet: it gives them no CORRAL_JOBGROUP_HOSTS (Slurm clusters "
                "and SSH pools whose machines share a home can)")


def no_candidate_reasons(plan: Plan) -> list[str]:
    """Why no place can run the task, one line a reason: those that answered, those that did not, and
    the kinds asked for that have no place set up."""
    return plan.refusals() + plan.unanswered() + not_set_up_reasons(plan)


def no_candidate_message(plan: Plan) -> str:
    """Why no place can run the task: a line, then each place's reason on a line of its own (errors.listed)."""
    reasons = no_candidate_reasons(plan)
    if not reasons:
        return "no cluster matches the task's infra"
    return listed("no cluster can run this task:", reasons)
