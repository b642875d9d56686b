"""SshPoolInfra: a pool of plain machines behind the Infra seam (`ssh/<pool>`), each reached over ssh
with the transport's ControlMasters; nothing is installed on them.

- probe: one round trip per machine, in parallel (`inventory.py`); a machine that does not answer is a
  node that is down, with the reason; the pool is one place (`partition`) named as the pool.
- submit: the machines that have the task's GPUs and CPUs free (as the last probe saw them, less what
  was placed there since), fullest first, so that tasks pack; on each in turn, the task's files (the
  workdir into the machine's cache of its folder, infra/caches.py), then one round trip that copies the
  workdir from the cache, claims GPUs and CPUs and starts it (`runner.submit_script`, claims.py), until
  one accepts. When none can, the task waits in the queue of the machine with the least queued for
  its size (claims.py), and starts there once what it wants is free; a dev allocation is refused
  instead. A multi-node task takes one machine per node, in rank
  order, each rank in its own run dir (`<token>.<rank>`, as homes are often shared); when too few
  machines accept, the ranks started are cancelled and the task is refused. Its handle names its
  machines, rank 0 first (`<host0>,<host1>/<token>`).
- status: one round trip per machine that has tasks; a multi-node task is running while its ranks
  run, has ended when all have, and fails with its first failing rank (the others are then cancelled,
  as srun's --kill-on-bad-exit does). A machine that stops answering fails its tasks
  (an infrastructure failure, which the controller recovers elsewhere) once it has been silent for
  MACHINE_GRACE_SECONDS; before that, its tasks' state is UNKNOWN (nothing changes). The other
  machines' tasks are reported as usual: one machine down is not the pool down. With `others`, every
  machine also lists the runs no handle names (a lost answer), a multi-node task's as one task once
  all its ranks are found.
- cancel, logs: on the task's machines, named in its handle (`<host>/<token>`); logs are every rank's.
- checkpoints (CopiesCheckpoints): fetched from the machine whose copy changed last.
- dev allocations: a holder task per machine (`runner.holder_script`, `dev.py`); exec runs on every
  machine at once over ssh, `corral ssh` and the ssh alias reach the head machine directly.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import re
import shlex
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import ClassVar, TypeGuard

from corral.config import PoolEntry, corral_home
from corral.errors import ClusterError, ClusterUnreachableError, CorralError, ProbeParseError, asked_again
from corral.gpu_names import normalize_gpu_name
from corral.infra.base import (
    EXIT_NOT_READY,
    AllocationPhase,
    AllocationState,
    AttemptFiles,
    ClusterSnapshot,
    CopiesCheckpoints,
    EndedRun,
    FailureClass,
    FollowsSetup,
    GpuPool,
    HoldsAllocations,
    HostsJobGroups,
    Infra,
    JobRequest,
    JobState,
    JobStatus,
    Node,
    OutputSink,
    Partition,
    PendingDemand,
    PrunesWorkdirCaches,
    RemovesRunFiles,
    ReportsSetupFailure,
    SessionKeys,
    SshRoute,
    SubmitResult,
    TakesFolderStreams,
)
from corral.infra import caches
from corral.infra.ranks import LINE_LIMIT, WholeLines, first_failure, rank_label
from corral.infra.shell import (
    CONTAINER_FILE,
    WRAPPED_RUNTIMES,
    check_token,
    container_wrapper,
    remove_group_dirs_script,
    render_env,
)
from corral.infra.sshpool import dev as pooldev
from corral.infra.sshpool import claims, moves, runner
from corral.infra.sshpool.moves import MOVE_GRACE_SECONDS
from corral.infra.sshpool.inventory import (
    MARK,
    Gpu,
    Inventory,
    Wants,
    inventory_script,
    parse_inventory,
)
from corral.infra.sshpool.submissions import CacheSync, MachineSubmissions
from corral.pacing import keep_pace
from corral.ssh import RemoteResult, SshTransport
from corral.timefmt import slurm_time

JOB_TIMEOUT = 30
MACHINE_GRACE_SECONDS = 30.0
MOVE_CHECK_SECONDS = 10.0  # while tasks wait, how often a status pass looks for a machine to move them to
SPOOL_IN_MEMORY = 1 << 20  # bytes of a rank's output a log snapshot keeps in memory before it spools to disk
_RUN_DIR = re.compile(r"^\.corral/runs/([0-9a-f]{12}(?:\.[0-9]+)?)/")
SILENT_WAIT_SECONDS = 0.5  # how long a status pass waits for a machine silent since an earlier one


@dataclass
class _Machines:
    """What the server process knows of one pool's machines across every SshPoolInfra it builds (one per
    request's Client, and the controller's). Held per instance, a machine's silence restarted with each
    request, so that a machine cut off while `corral queue` was asked every few seconds was not declared
    down for minutes."""

    silent_since: dict[str, float] = field(default_factory=dict)  # machine -> when it first did not answer
    failures: dict[str, str] = field(default_factory=dict)  # a silent machine -> its last failure
    # A silent machine's status query, which later passes wait for SILENT_WAIT_SECONDS only: its connect
    # timeout would hold up the pool's whole answer, and a pool whose status query is overdue is left out
    # of placement (tracker.left_out), so that one dead machine kept every task off all the others, a
    # managed job's recovery from it included. One at a time per machine.
    queries: dict[str, asyncio.Future[RemoteResult]] = field(default_factory=dict)
    moving: set[str] = field(default_factory=set)  # tokens this process is moving between machines now

    def heard_from(self, host: str, query: asyncio.Future[RemoteResult] | None = None) -> None:
        """The machine answered (to `query`, if given): it is silent no more, and that query is out no
        longer (any query, if none is given)."""
        self.silent_since.pop(host, None)
        self.failures.pop(host, None)
        if query is None or self.queries.get(host) is query:
            self.queries.pop(host, None)


_MACHINES: dict[tuple[str, str], _Machines] = {}  # by (Corral home, pool)


class _StillSilent(ClusterUnreachableError):
    """A silent machine's query not answered within SILENT_WAIT_SECONDS; it carries its last failure."""


@dataclass(frozen=True)
class _Upload:
    """A file or folder kept back until the task's machine is chosen; a workdir goes through that
    machine's cache of its folder (`cache_key`, infra/caches.py)."""

    local: Path
    remote: str
    cache_key: str | None = None


def configured_gpus(spec: str) -> tuple[Gpu, ...]:
    """A pool config's `TYPE:N` for a machine without nvidia-smi."""
    name, _, count = spec.rpartition(":")
    return tuple(Gpu(i, name, None, None) for i in range(int(count)))


class SshPoolInfra(Infra, ReportsSetupFailure, HoldsAllocations, FollowsSetup, CopiesCheckpoints,
                   RemovesRunFiles, PrunesWorkdirCaches, HostsJobGroups):
    kind: ClassVar[str] = "ssh"
    execs_on_fewer_nodes: ClassVar[bool] = False  # each machine's variables (vars.sh) name them all
    ends_what_it_declared_failed: ClassVar[bool] = True  # MACHINE_DOWN

    def __init__(self, pool: PoolEntry, transport: SshTransport):
        self.pool = pool
        self.transport = transport
        self._configured = {host: configured_gpus(spec) for host, spec in pool.gpus}
        self._inventories: dict[str, Inventory] = {}
        self._pending: dict[str, list[_Upload]] = {}  # token -> uploads for its machine
        self._machines = _MACHINES.setdefault((str(corral_home()), pool.name), _Machines())
        self._existing: dict[str, bool] = {}  # token -> its rank 0 was already running (a retried submit)
        self._machine_submissions: dict[str, MachineSubmissions] = {}
        # What was started on (or queued at) each machine since its last probe, so that the tasks of a
        # sweep spread as they are submitted, before the next probe sees them.
        self._booked: dict[str, list[Wants]] = {}
        self._booked_queued: dict[str, int] = {}
        self._last_move_check = -MOVE_CHECK_SECONDS

    @property
    def name(self) -> str:
        return f"ssh/{self.pool.name}"

    # ---- capacity -------------------------------------------------------------------------------------
    async def probe(self, *, associations: bool = False, paths: tuple[str, ...] = (),
                    filesystems: tuple[str, ...] = ()) -> ClusterSnapshot:
        started = time.monotonic()
        answers = await asyncio.gather(*(self._inventory(host) for host in self.pool.hosts), return_exceptions=True)
        nodes, warnings = [], []
        for host, answer in zip(self.pool.hosts, answers):
            if isinstance(answer, BaseException):
                if not isinstance(answer, CorralError):
                    raise answer
                nodes.append(Node(host, (self.pool.name,), "down*", False, 0, 0, 0, 0, (), str(answer)))
                continue
            self._inventories[host] = answer
            self._booked.pop(host, None)
            self._booked_queued.pop(host, None)
            warnings += answer.warnings
            nodes.append(_node(self.pool.name, host, answer))
        if not any(n.usable for n in nodes):
            reasons = "; ".join(n.reason or n.name for n in nodes)
            raise ClusterUnreachableError(self.pool.name, f"no machine of the pool answers ({reasons})")
        partition = Partition(self.pool.name, True, "UP", "UNLIMITED", None, len(nodes))
        waiting = tuple(PendingDemand((self.pool.name,), w.gpu_type or None, w.gpus)
                        for inventory in self._inventories.values() for w in inventory.queued)
        answered = [self._inventories[n.name] for n in nodes if n.usable and n.name in self._inventories]
        runtimes = tuple(r for r in WRAPPED_RUNTIMES if all(r in i.runtimes for i in answered))  # on every one
        return ClusterSnapshot(self.pool.name, None, tuple(nodes), (partition,), waiting, kind="ssh",
                               probe_seconds=time.monotonic() - started, warnings=tuple(warnings),
                               container_runtimes=runtimes)

    async def _inventory(self, host: str) -> Inventory:
        result = await self.transport.run(host, inventory_script(), timeout=self.transport.timeout)
        try:
            return parse_inventory(host, result.stdout, self._configured.get(host, ()))
        except ProbeParseError as exc:
            raise ProbeParseError(host, exc.detail) from None

    # ---- files ----------------------------------------------------------------------------------------
    def attempt_files(self, request: JobRequest) -> AttemptFiles:
        directory = runner.run_dir(_rank_token(request.token, 0, request.num_nodes))
        return AttemptFiles(directory, (f"{directory}/log.txt",))

    async def upload(self, local: Path, remote: str, token: str | None = None) -> None:
        """Kept until the task's machine is chosen (submit); a path outside a run's folder goes to every
        machine of the pool at once."""
        if not self._keep(_Upload(Path(local), remote)):
            await asyncio.gather(*(self.transport.sync(host, Path(local), remote) for host in self.pool.hosts))

    async def workdir_upload_size(self, local: Path, cache_key: str) -> int | None:
        """What the machine whose cache holds most of the workdir lacks (a relaunch goes back to that one
        unless its GPUs are taken): an rsync dry run against each machine's cache, all at once."""
        sizes = await asyncio.gather(*(caches.lacks(self.transport, host, local, cache_key)
                                       for host in self.pool.hosts), return_exceptions=True)
        known = [size for size in sizes if isinstance(size, int)]
        return min(known) if known else None

    async def upload_workdir(self, local: Path, cache_key: str, remote: str) -> None:
        """Kept as upload keeps a file; once the machine is chosen, rsync into its cache of the folder
        (only changes travel) and a hard-linked copy into the run directory, made by the submission's
        own round trip (runner.submit_script)."""
        if not self._keep(_Upload(Path(local), remote + "/", cache_key)):
            await self.upload(local, remote + "/")

    def _keep(self, upload: _Upload) -> bool:
        """Keep an upload into a run's folder for its machine, by the attempt's token (a multi-node
        task's rank 0 dir stands for every rank's); False for any other path."""
        match = _RUN_DIR.match(upload.remote)
        if match:
            self._pending.setdefault(match.group(1).split(".")[0], []).append(upload)
        return match is not None

    async def deliver_uploads(self, handle: str) -> None:
        """An allocation's machines are known: what was kept for its run directory goes to each one's
        rank directory now, every machine at once."""
        hosts, token = _hosts_and_token(handle)
        pending = self._pending.pop(token, [])
        await asyncio.gather(*(self.transport.sync(host, u.local, _for_rank(u.remote, token, _rank_token(
            token, rank, len(hosts)))) for rank, host in enumerate(hosts) for u in pending))

    # ---- jobs -----------------------------------------------------------------------------------------
    def _free(self, host: str, wants: Wants) -> tuple[int, int, int] | None:
        """GPUs of the type, CPUs and memory (MB) free on the machine, as the last probe saw them less
        what was started there since (None: not probed)."""
        inventory = self._inventories.get(host)
        if inventory is None:
            return None
        gpus = _of_kind(inventory.free_gpus, wants.gpu_type)
        cpus = inventory.cpus - inventory.cpus_claimed
        memory = inventory.memory_mb - inventory.memory_claimed_mb
        for booked in self._booked.get(host, []):
            if booked.gpus and _same_kind(booked.gpu_type, wants.gpu_type):
                gpus -= booked.gpus
            cpus -= booked.cpus
            memory -= booked.memory_mb
        return gpus, cpus, memory

    def _fits(self, host: str, wants: Wants, free: tuple[int, int, int] | None) -> bool:
        """Can the machine start what is wanted now, as far as Corral knows: it is free (`free`, from
        _free), and nothing waits in its queue for the same (which would go first)?"""
        if free is None or free[0] < wants.gpus or free[1] < wants.cpus or free[2] < wants.memory_mb:
            return False
        return not any(_competes(waiting, wants) for waiting in self._inventories[host].queued)

    def _order(self, request: JobRequest) -> list[str]:
        return self._fitting(_wants(request))

    def _fitting(self, wants: Wants, besides: str | None = None) -> list[str]:
        """Machines (other than `besides`) that can start what is wanted now, fullest first (tasks pack,
        keeping whole machines free for big ones; CPU tasks go first to machines with the fewest free GPUs)."""
        free = {h: self._free(h, wants) for h in self.pool.hosts if h != besides}
        fits = [h for h in free if self._fits(h, wants, free[h])]
        return sorted(fits, key=lambda h: (*(free[h] or (0, 0, 0)), self.pool.hosts.index(h)))

    def _queue_for(self, request: JobRequest) -> str | None:
        """The machine to wait on: of those that could ever start it, the one with the least queued per
        task of its size it can run at once (machines not probed yet last)."""
        wants = _wants(request)

        def load(host: str) -> tuple[bool, float, int]:
            inventory = self._inventories.get(host)
            if inventory is None:
                return True, 0.0, self.pool.hosts.index(host)
            waiting = len(inventory.queued) + self._booked_queued.get(host, 0)
            if wants.gpus:
                slots = _of_kind(inventory.gpus, wants.gpu_type) // wants.gpus
            else:
                slots = inventory.cpus // wants.cpus if wants.cpus else 1
            return False, waiting / max(slots, 1), self.pool.hosts.index(host)

        def could(host: str) -> bool:
            inventory = self._inventories.get(host)
            return inventory is None or (
                inventory.cpus >= wants.cpus and inventory.memory_mb >= wants.memory_mb
                and _of_kind(inventory.gpus, wants.gpu_type) >= wants.gpus)

        return min((h for h in self.pool.hosts if could(h)), key=load, default=None)

    async def submit(self, request: JobRequest) -> SubmitResult:
        return await self._submit(request, None)

    async def _submit(self, request: JobRequest, idle_seconds: int | None) -> SubmitResult:
        """A task starts on the first machine that can start it now; else it waits in one machine's queue
        (runner.submit_script). A dev allocation does not wait: it tries every machine, and is refused
        when none can start it."""
        if request.num_nodes > 1:
            return await self._submit_ranks(request, idle_seconds)
        wants, why = _wants(request), []
        order = self._order(request)
        if idle_seconds is not None:
            order += [h for h in self.pool.hosts if h not in order]
        for host in order:
            self._booked.setdefault(host, []).append(wants)
            answer = await self._start_rank(request, host, 0, (), idle_seconds)
            if answer is None:
                return self._accepted(request, host)
            self._booked[host].remove(wants)
            why.append(answer)
        if idle_seconds is None and (host := self._queue_for(request)) is not None:
            self._booked_queued[host] = self._booked_queued.get(host, 0) + 1
            answer = await self._start_rank(request, host, 0, (), None, may_queue=True)
            if answer is None:
                return self._accepted(request, host)
            why.append(answer)
        if not why:
            why = [f"no machine has {_wants_text(wants)}"]
        return SubmitResult(False, None, False, f"no machine of {self.name} can start it now ({'; '.join(why)})")

    def _accepted(self, request: JobRequest, host: str) -> SubmitResult:
        self._pending.pop(request.token, None)
        return SubmitResult(True, f"{host}/{request.token}", self._existing.pop(request.token, False), "")

    async def _submit_ranks(self, request: JobRequest, idle_seconds: int | None) -> SubmitResult:
        """One rank per machine, on the first machines the last probe saw with the GPUs free, each told
        every rank's address; all start, or those started are cancelled and the task is refused."""
        hosts = self._order(request)[:request.num_nodes]
        if len(hosts) < request.num_nodes:
            return SubmitResult(False, None, False, f"{self.name}: {len(hosts)} machine(s) have the GPUs free, "
                                                    f"not {request.num_nodes}")
        addresses = [self._address(h) for h in hosts]
        handle = f"{','.join(hosts)}/{request.token}"
        for rank, host in enumerate(hosts):
            answer = await self._start_rank(request, host, rank, addresses, idle_seconds)
            if answer is not None:  # the ranks started are ended, and their env.sh (secrets) removed at once
                # (no handle names them); this rank's too: a lost answer may hide a start, and a refusal
                # left nothing to end. A machine that does not answer keeps what it started.
                await self._end_ranks([(h, f"{request.token}.{r}") for r, h in enumerate(hosts[:rank])])
                with contextlib.suppress(ClusterError):  # its machine does not answer: nothing can reach it
                    await self._end_ranks([(host, f"{request.token}.{rank}")])
                self._existing.pop(request.token, None)
                return SubmitResult(False, None, False, f"{self.name}: rank {rank} could not start on {host} ({answer})")
        self._pending.pop(request.token, None)
        return SubmitResult(True, handle, self._existing.pop(request.token, False), "")

    def _submissions(self, host: str) -> MachineSubmissions:
        """The machine's submissions, sent together (submissions.py)."""
        found = self._machine_submissions.get(host)
        if found is None:
            async def run(script: str, timeout: float) -> str:
                return (await self.transport.run(host, script, timeout=timeout)).stdout

            async def sync(workdir: CacheSync) -> None:
                await caches.sync_into(self.transport, host, workdir.local, workdir.key)

            found = self._machine_submissions[host] = MachineSubmissions(host, run, sync, JOB_TIMEOUT)
        return found

    def _address(self, host: str) -> str:
        inventory = self._inventories.get(host)
        return (inventory.address if inventory else None) or host

    async def _start_rank(self, request: JobRequest, host: str, rank: int, addresses: Sequence[str],
                          idle_seconds: int | None = None, may_queue: bool = False) -> str | None:
        """Start node `rank` of the request on `host` (with `idle_seconds`, a dev allocation's holder), or
        with `may_queue` queue it there; None when it runs or waits, else why not."""
        token = _rank_token(request.token, rank, request.num_nodes)
        ranked = replace(request, token=token)
        job = (runner.job_script(request, self.pool.name, rank, addresses) if idle_seconds is None
               else runner.holder_script(request, self.pool.name, rank, addresses, idle_seconds))
        files = {"job.sh": job,
                 "env.sh": render_env(dict(request.envs)), "setup.sh": request.setup or "", "run.sh": request.run or ""}
        if request.num_nodes > 1:  # a rank found without its handle is adopted only with all its task's ranks
            files[runner.NODES_FILE] = f"{request.num_nodes}\n"
        if request.container_image:  # a holder's setup, execs and shells run in the image too (pooldev)
            files[CONTAINER_FILE] = container_wrapper(request.container_runtime or "", request.container_image,
                                                      request.accelerators_per_node > 0)
        pending = self._pending.get(request.token, [])
        return await self._send_and_start(host, rank, request, ranked, pending, files, may_queue)

    async def _send_and_start(self, host: str, rank: int, request: JobRequest, ranked: JobRequest,
                              pending: list[_Upload], files: dict[str, str], may_queue: bool) -> str | None:
        token = ranked.token
        workdir = next((CacheSync(u.local, u.cache_key) for u in pending if u.cache_key), None)
        cache = caches.cache_path(workdir.key) if workdir else None
        try:
            for upload in pending:
                if upload.cache_key:
                    continue  # synced into the cache by the machine's submissions, right before the copy
                target = _for_rank(upload.remote, request.token, token)
                if cache:  # kept apart until the workdir is copied from the cache (runner.submit_script)
                    target = _staged(target, token)
                await self.transport.sync(host, upload.local, target)
            script = runner.submit_script(ranked, self.pool.name, files, self._configured_names(host),
                                          workdir_cache=cache, may_queue=may_queue)
            stdout = await self._submissions(host).submit(script, workdir)
        except ClusterError as exc:
            return str(exc)
        answer = _answer_line(stdout)
        words = answer.split(maxsplit=3)
        if words[1:2] == ["submitted"] and len(words) >= 3:
            if len(words) > 3 and words[3] == "existing" and rank == 0:
                self._existing[request.token] = True
            return None
        return answer.removeprefix(f"{MARK} rejected ").strip() or f"{host}: no answer"

    async def status(self, handles: list[str], accounts: Sequence[str] = (), *, others: bool = True
                     ) -> list[JobStatus]:
        by_host: dict[str, list[str]] = {}
        tasks: list[tuple[str, list[tuple[str, str]]]] = []  # (handle, (host, rank token) per rank)
        for handle in handles:
            if ranks := self._ranks(handle):
                tasks.append((handle, ranks))
            for host, rank_token in ranks:
                by_host.setdefault(host, []).append(rank_token)
        if others:  # every machine, for what it runs that no handle names (a submission's lost answer)
            for host in self.pool.hosts:
                by_host.setdefault(host, [])
        answers = await asyncio.gather(*(self._status_answer(h, runner.status_script(t, others))
                                         for h, t in by_host.items()), return_exceptions=True)
        found: dict[tuple[str, str], JobStatus] = {}
        nodes: dict[str, tuple[str, int]] = {}  # `others`: a rank token no handle names -> (its machine, ranks)
        marks: dict[tuple[str, str], tuple[str, str, float | None]] = {}  # a move under way or done (moves.py)
        waiting: list[tuple[str, str, int, Wants]] = []  # tasks asked for that wait in a machine's queue
        asked_handles = set(handles)
        now = time.time()
        for (host, tokens), answer in zip(by_host.items(), answers):
            if not self._answered(answer, host, now):  # answer is the ClusterError
                since = self._machines.silent_since[host]
                # Declared down on a failure seen, never on a wait cut short (it may yet answer).
                if now - since < MACHINE_GRACE_SECONDS or isinstance(answer, _StillSilent):
                    for t in tokens:
                        found[(host, t)] = JobStatus(f"{host}/{t}", t, JobState.UNKNOWN, "NO_ANSWER",
                                                     f"{host} does not answer ({answer.detail})", None, None, None, None)
                    continue
                for t in tokens:
                    found[(host, t)] = JobStatus(f"{host}/{t}", t, JobState.FAILED, "MACHINE_DOWN",
                                                 f"{host} has not answered for {now - since:.0f} s ({answer.detail})",
                                                 None, None, now, None, failure=FailureClass.INFRA)
                continue
            for status in _statuses(host, answer.stdout):
                found[(host, status.token or "")] = status
            nodes.update({rank: (host, n) for rank, n in _rank_marks(answer.stdout).items()})
            marks.update({(host, token): mark for token, mark in _move_marks(answer.stdout).items()})
            waiting += [(host, token, ahead, wants) for token, (ahead, wants) in _queued(answer.stdout).items()
                        if f"{host}/{token}" in asked_handles]
        if marks:
            await self._finish_moves(marks, found)
        if waiting:
            await self._move_waiting(waiting, found)
        out, stray = [], []
        for handle, ranks in tasks:
            parts = [found[r] for r in ranks if r in found]
            if len(parts) != len(ranks):
                continue  # a rank the machine does not know (yet): the task as a whole is not known
            combined = _combined(handle, _hosts_and_token(handle)[1], parts)
            out.append(combined)
            stray += _stray_ranks(combined, found)
        if others:
            asked = {rank for _, ranks in tasks for rank in ranks}
            unnamed = {key: status for key, status in found.items() if key not in asked}
            out += [status for (_, token), status in unnamed.items() if "." not in token]
            for combined in _whole_tasks(unnamed, nodes):
                out.append(combined)
                # e.g. the rank of a task declared failed (MACHINE_DOWN) on a machine that answers again
                stray += _stray_ranks(combined, unnamed)
        if stray:  # a multi-node task that failed on one node ends on every node
            await self._cancel_ranks(stray)
        return out

    async def cancel(self, handles: list[str], run_dirs: list[str]) -> None:
        """Cancel every rank of each task; a partial task's (`_whole_tasks`) also loses its env.sh at once,
        as no attempt will name its ranks later for the ended runs' clean-up."""
        partial = [h for h in handles if NOT_FOUND in _hosts_and_token(h)[0]]
        await asyncio.gather(
            self._cancel_ranks([rank for handle in handles if handle not in partial for rank in self._ranks(handle)]),
            self._end_ranks([rank for handle in partial for rank in self._ranks(handle)]))

    async def prune_workdir_caches(self, keep_days: float) -> int:
        """Each machine's own caches (infra/caches.py), every machine at once; one that does not answer
        fails the pass, the others' removals stand."""
        script = caches.prune_script(keep_days)
        answers = await asyncio.gather(*(self.transport.run(h, script, timeout=JOB_TIMEOUT * 4)
                                         for h in self.pool.hosts), return_exceptions=True)
        pruned = 0
        for answer in answers:
            if isinstance(answer, BaseException):
                raise answer
            pruned += caches.read_pruned(answer.stdout)
        return pruned

    async def remove_env_files(self, ended: list[EndedRun]) -> None:
        await self._per_machine([rank for run in ended for rank in self._ranks(run.handle or "")],
                                runner.remove_env_script)

    async def remove_run_dirs(self, ended: list[EndedRun]) -> None:
        await self._per_machine([rank for run in ended for rank in self._ranks(run.handle or "")],
                                runner.remove_run_dirs_script)

    def job_group_refusal(self) -> str | None:
        """A job group's tasks find each other through files in one home: the machines must share it."""
        homes = {inventory.home for inventory in self._inventories.values()}
        if None in homes or len(homes) > 1:
            return ("its machines do not share one home, through which a job group's tasks find each other "
                    "(CORRAL_JOBGROUP_HOSTS)")
        return None

    async def remove_group_files(self, group_ids: list[str]) -> None:
        """From the home the machines share: the first of them that answers."""
        if not group_ids:
            return
        script = remove_group_dirs_script(group_ids)
        error: CorralError | None = None
        for host in self.pool.hosts:
            try:
                await self.transport.run(host, script, timeout=JOB_TIMEOUT)
                return
            except CorralError as exc:
                error = exc
        assert error is not None
        raise error

    def _ranks(self, handle: str) -> list[tuple[str, str]]:
        """A task's ranks as (machine, rank token), rank 0 first; none for a handle that names a machine
        the pool no longer has (nothing can reach it there)."""
        hosts, token = _hosts_and_token(handle)
        if not hosts or not token or any(h not in self.pool.hosts for h in hosts if h != NOT_FOUND):
            return []
        return [(h, check_token(_rank_token(token, r, len(hosts)))) for r, h in enumerate(hosts) if h != NOT_FOUND]

    async def _end_ranks(self, ranks: list[tuple[str, str]]) -> None:
        """Cancel these ranks and remove their env.sh (secrets) at once: no handle names them."""
        await self._cancel_ranks(ranks)
        await self._per_machine(ranks, runner.remove_env_script)

    async def _cancel_ranks(self, ranks: list[tuple[str, str]]) -> None:
        """Cancel on each rank's machine; a task another machine took from it (its handle not yet
        updated) is cancelled there too."""
        answers = await self._per_machine(ranks, runner.cancel_script)
        moved = [(target, token) for stdout in answers for line in stdout.splitlines()
                 if line.startswith(f"{MARK} moved ") and len(words := line.split()) == 4
                 and (target := self._destination(words[3])) is not None and (token := words[2])]
        if moved:
            await self._per_machine(moved, runner.cancel_script)

    async def _per_machine(self, ranks: list[tuple[str, str]], script: Callable[[list[str]], str]) -> list[str]:
        """The script for every rank on each machine: one round trip per machine, all at once; their
        outputs."""
        by_host: dict[str, list[str]] = {}
        for host, token in ranks:
            by_host.setdefault(host, []).append(token)
        results = await asyncio.gather(*(self.transport.run(h, script(t), timeout=JOB_TIMEOUT)
                                         for h, t in by_host.items()))
        return [r.stdout for r in results]

    # ---- moves: a waiting task goes to a machine that can start it now (moves.py) -------------------
    def _destination(self, machine: str) -> str | None:
        """The pool's name for a machine that calls itself `machine` (its run dirs' `host`), if it has it."""
        if machine in self.pool.hosts:
            return machine
        return next((h for h, inventory in self._inventories.items() if inventory.host == machine), None)

    def _moves(self, waiting: list[tuple[str, str, int, Wants]]) -> list[tuple[str, str, str]]:
        """(machine, token, target) for each waiting task another machine can start now, as the last probe
        saw them: those with fewest tasks ahead first; the target as a launch picks (`_fitting`: fullest
        first), its capacity booked for the next."""
        out = []
        for host, token, _ahead, wants in sorted(waiting, key=lambda w: (w[2], self.pool.hosts.index(w[0]))):
            if fits := self._fitting(wants, besides=host):
                self._booked.setdefault(fits[0], []).append(wants)
                out.append((host, token, fits[0]))
        return out

    async def _move_waiting(self, waiting: list[tuple[str, str, int, Wants]],
                            found: dict[tuple[str, str], JobStatus]) -> None:
        """Tasks wait in machines' queues: at most every MOVE_CHECK_SECONDS, probe the pool and move each
        that another machine can start now (its status becomes the new machine's)."""
        if time.monotonic() - self._last_move_check < MOVE_CHECK_SECONDS:
            return
        self._last_move_check = time.monotonic()
        try:
            await self.probe()
        except CorralError:
            return
        for host, token, target in self._moves(waiting):
            moved = await self._move(host, token, target)
            if moved is not None:
                found[(host, token)] = moved

    async def _move(self, host: str, token: str, target: str) -> JobStatus | None:
        """Move one waiting task (moves.py); its status on the target, or None where it stays. An answer
        lost on the way leaves the `moving` mark for a later status pass to finish (_finish_moves)."""
        self._machines.moving.add(token)
        try:
            withdrawn = await self._answer(host, moves.withdraw_script(token, target))
            if withdrawn[:1] != ["withdrawn"] or len(withdrawn) != 2:
                return None
            if not self._same_home(host, target):
                try:
                    await self._copy_run_dir(host, target, token)
                except CorralError:  # no take was sent: the task goes back into its queue now
                    await self._settle_quietly(host, token, False)
                    await self._discard_quietly(target, token)
                    return None
            # A take that fails (its answer may be lost after the take) leaves the mark: a later pass asks
            # the target (_finish_moves).
            take = moves.take_script(token, withdrawn[1], self._configured_names(target))
            taken = await self._answer(target, take)
            if taken[:1] == ["refused"]:
                await self._settle_quietly(host, token, False)
            if taken[:1] != ["submitted"]:
                return None
            await self._settle_quietly(host, token, True, target)
            started = taken[2:3] != ["queued"]
            now = time.time()
            return JobStatus(f"{target}/{token}", token, JobState.RUNNING if started else JobState.PENDING,
                             "RUNNING" if started else "QUEUED",
                             None if started else f"Resources (waiting on {target}, moved from {host})",
                             None, now if started else None, None, None, moved=True)
        except CorralError:
            return None
        finally:
            self._machines.moving.discard(token)

    async def _finish_moves(self, marks: dict[tuple[str, str], tuple[str, str, float | None]],
                            found: dict[tuple[str, str], JobStatus]) -> None:
        """Moves a status pass found under way or done (`runner.status_script`'s `moving` and `moved`):
        each task is reported as its target sees it, under its new handle, once the target has it (and a
        `moving` copy left behind is settled); one the target does not have goes back into its queue
        once MOVE_GRACE_SECONDS have passed (its mover died), and is PENDING meanwhile."""
        asks: dict[str, list[str]] = {}
        for (_host, token), (_kind, machine, _since) in marks.items():
            if (target := self._destination(machine)) is not None and token not in self._machines.moving:
                asks.setdefault(target, []).append(token)
        answers = await asyncio.gather(*(self.transport.run(h, runner.status_script(t), timeout=JOB_TIMEOUT)
                                         for h, t in asks.items()), return_exceptions=True)
        there: dict[str, JobStatus] = {}
        answered: set[str] = set()
        now = time.time()
        for target, answer in zip(asks, answers):
            if not self._answered(answer, target, now):
                continue
            answered.add(target)
            there.update({s.token or "": s for s in _statuses(target, answer.stdout)})
        for (host, token), (kind, machine, since) in marks.items():
            if (status := there.get(token)) is not None:
                found[(host, token)] = replace(status, moved=True)
                if kind == "moving":
                    await self._settle_quietly(host, token, True, status.handle.split("/")[0])
                continue
            target = self._destination(machine)
            # Undone once the target says it does not have it, or has been silent as long as a machine
            # whose tasks are called failed (it may have taken it: then that run is lost with it).
            silent = target is None or now - self._machines.silent_since.get(target, now) >= MOVE_GRACE_SECONDS
            marked_long_ago = now - (since or now) >= MOVE_GRACE_SECONDS
            if kind == "moving" and token not in self._machines.moving and marked_long_ago and (
                    silent or target in answered):
                await self._settle_quietly(host, token, False)
                if target is not None:
                    await self._discard_quietly(target, token)
            state = JobState.PENDING if kind == "moving" else JobState.UNKNOWN
            found[(host, token)] = JobStatus(f"{host}/{token}", token, state, "MOVING",
                                             f"Resources (moving from {host} to {machine})", None, None, None, None)

    async def _status_answer(self, host: str, script: str) -> RemoteResult:
        """The machine's answer to a status script. A machine silent since an earlier pass is asked again,
        but waited for SILENT_WAIT_SECONDS only, one query at a time (_Machines.queries): a pass that does
        not see it end raises _StillSilent (its tasks stay as they were); the pass that does gets its
        failure, or, once it has answered (which ends the silence), asks its own script as usual."""
        if host not in self._machines.silent_since:
            return await self.transport.run(host, script, timeout=JOB_TIMEOUT)
        query = self._machines.queries.get(host)
        if query is None or query.get_loop() is not asyncio.get_running_loop():
            query = asyncio.ensure_future(self.transport.run(host, script, timeout=JOB_TIMEOUT))
            query.add_done_callback(functools.partial(self._silent_query_ended, host))
            self._machines.queries[host] = query
        await asyncio.wait({query}, timeout=SILENT_WAIT_SECONDS)
        if not query.done():
            raise self._still_silent(host)
        self._machines.queries.pop(host, None)
        failure = None if query.cancelled() else query.exception()
        if failure is not None:
            raise failure
        return await self.transport.run(host, script, timeout=JOB_TIMEOUT)  # it answers again: our script too

    def _silent_query_ended(self, host: str, query: asyncio.Future[RemoteResult]) -> None:
        """A silent machine that answers, whether or not a pass still waits: its silence ends (a machine
        slower to answer than SILENT_WAIT_SECONDS is not down)."""
        if not query.cancelled() and query.exception() is None:
            self._machines.heard_from(host, query)

    def _still_silent(self, host: str) -> _StillSilent:
        failure = self._machines.failures.get(host) or "no answer"
        return _StillSilent(host, asked_again(failure, SILENT_WAIT_SECONDS))

    def _answered(self, answer: RemoteResult | BaseException, host: str, now: float) -> TypeGuard[RemoteResult]:
        """Did the machine answer (`answer`: a round trip's result, or what it raised)? One that does not is
        silent since the first time it did not (_Machines.silent_since); what is not a ClusterError is raised."""
        if isinstance(answer, BaseException):
            if not isinstance(answer, ClusterError):
                raise answer
            self._machines.silent_since.setdefault(host, now)
            if not isinstance(answer, _StillSilent):
                self._machines.failures[host] = answer.detail
            return False
        self._machines.heard_from(host)
        return True

    async def _settle_quietly(self, host: str, token: str, taken: bool, target: str | None = None) -> None:
        """settle_script on the machine a task left (a failure leaves the mark for the next pass); a
        cancel that reached the copy left behind is carried out on `target`, which took it."""
        try:
            settled = await self._answer(host, moves.settle_script(token, taken, self._configured_names(host)))
            if target is not None and settled[1:2] == ["cancelled"]:
                await self._cancel_ranks([(target, token)])
        except CorralError:
            return

    async def _discard_quietly(self, target: str, token: str) -> None:
        """discard_script on the target of a move undone (a failure leaves a copy it never runs)."""
        try:
            await self._answer(target, moves.discard_script(token))
        except CorralError:
            return

    async def _answer(self, host: str, script: str) -> list[str]:
        """The words after `@@corral` on the script's answer line (empty: none)."""
        return _answer_line((await self.transport.run(host, script, timeout=JOB_TIMEOUT)).stdout).split()[1:]

    def _configured_names(self, host: str) -> list[str]:
        """The machine's GPUs from the pool's config (none: nvidia-smi's), as the claims library takes them."""
        return [g.name for g in self._configured.get(host, ())]

    def _same_home(self, a: str, b: str) -> bool:
        first, second = self._inventories.get(a), self._inventories.get(b)
        return bool(first and second and first.home and first.home == second.home)

    async def _copy_run_dir(self, source: str, target: str, token: str) -> None:
        """The task's run dir from one machine's home to another's, through this process (fetch, then
        sync: only changes travel)."""
        with tempfile.TemporaryDirectory(prefix="corral-move-") as local:
            if not await self.transport.fetch(source, runner.run_dir(token), Path(local)):
                raise ClusterError(source, f"the run dir of {token} is gone")
            await self.transport.sync(target, Path(local), runner.run_dir(token) + "/")

    async def logs(self, handle: str, log_path: str, follow: bool, on_output: OutputSink, tail: int = 0) -> None:
        """Every rank's output, as a Slurm job's log holds every node's (_every_rank_output)."""
        hosts, token = _hosts_and_token(handle)
        await self._every_rank_output(hosts, lambda rank: runner.follow_script(_rank_token(token, rank, len(hosts)),
                                                                                 follow, tail), follow, on_output)

    async def _every_rank_output(self, hosts: list[str], script: Callable[[int], str], follow: bool,
                                 on_output: OutputSink) -> None:
        """What each rank's script prints on its machine: followed, as it comes, in whole lines; else
        rank 0's, then rank 1's, …. A rank whose machine has left the pool is left out."""
        if not hosts or hosts[0] not in self.pool.hosts:
            raise CorralError(f"{self.name}: {hosts[0] if hosts else '(none)'!r} is not one of its machines (any more)")
        ranks = [(rank, host) for rank, host in enumerate(hosts) if host in self.pool.hosts]
        labels = [rank_label(rank, len(hosts)) for rank, _ in ranks]
        if follow or len(ranks) == 1:
            await self._on_every_machine([h for _, h in ranks], lambda i: script(ranks[i][0]), on_output, labels)
            return
        # Each rank's output kept aside until the ranks before it are out: in memory up to 1 MiB, on disk
        # past that (a snapshot of a long run's logs can be GBs a rank).
        said = [tempfile.SpooledTemporaryFile(max_size=SPOOL_IN_MEMORY) for _ in ranks]
        try:
            failed = first_failure(await asyncio.gather(*(self.transport.stream(host, script(rank), said[i].write)
                                                          for i, (rank, host) in enumerate(ranks)),
                                                        return_exceptions=True))
            for spool, label in zip(said, labels):  # several ranks: each labelled (its last line ended)
                spool.seek(0)
                sink = WholeLines(on_output, label)
                while chunk := spool.read(65536):
                    sink(chunk)
                    await keep_pace()
                sink.flush()
            if failed is not None:  # after what the other ranks said
                raise failed
        finally:
            for spool in said:
                spool.close()

    # ---- dev allocations ------------------------------------------------------------------------------
    async def hold(self, request: JobRequest, idle_seconds: int, session_keys: SessionKeys) -> SubmitResult:
        """A holder on each machine of the allocation (the machines' own sshd serves sessions: the keys
        are not needed)."""
        return await self._submit(request, idle_seconds)

    async def allocation_states(self, held: list[tuple[str, str]]) -> dict[str, AllocationState]:
        by_host: dict[str, list[str]] = {}
        for handle, _ in held:
            hosts, token = _hosts_and_token(handle)
            for rank, host in enumerate(hosts):
                by_host.setdefault(host, []).append(_rank_token(token, rank, len(hosts)))
        answers = await asyncio.gather(*(self.transport.run(h, pooldev.states_script(t), timeout=JOB_TIMEOUT)
                                         for h, t in by_host.items()), return_exceptions=True)
        lines: dict[tuple[str, str], list[str]] = {}
        said: dict[tuple[str, str], list[str]] = {}  # a failed setup's last lines, per (host, rank token)
        silent: dict[str, str] = {}
        for host, answer in zip(by_host, answers):
            if isinstance(answer, BaseException):
                if not isinstance(answer, CorralError):
                    raise answer
                silent[host] = answer.detail if isinstance(answer, ClusterError) else str(answer)
                continue
            for line in answer.stdout.splitlines():
                parts = line.split()
                if line.startswith(f"{pooldev.SETUP_SAID} ") and len(parts) >= 3:
                    said.setdefault((host, parts[2]), []).append(line.split(" ", 3)[3] if len(parts) > 3 else "")
                elif len(parts) == 8 and not line.startswith(MARK):
                    lines[(host, parts[0])] = parts
        out: dict[str, AllocationState] = {}
        for handle, _ in held:
            hosts, token = _hosts_and_token(handle)
            ranks = [(h, _rank_token(token, r, len(hosts))) for r, h in enumerate(hosts)]
            out[handle] = _allocation_state(hosts, [lines.get(r) for r in ranks], silent,
                                            ["\n".join(said.get(r, [])) for r in ranks])
        return out

    async def setup_output(self, handle: str, run_dir: str, on_output: OutputSink) -> None:
        """Every machine's holder's output while its setup runs, as Slurm's srun shows every node's."""
        hosts, token = _hosts_and_token(handle)
        await self._on_every_machine(hosts, lambda rank: pooldev.setup_output_script(_rank_token(token, rank,
                                                                                                   len(hosts))),
                                     on_output)

    async def _on_every_machine(self, hosts: list[str], script: Callable[[int], str], on_output: OutputSink,
                                labels: list[bytes] | None = None) -> list[int]:
        """Each rank's script on its machine, all at once; their output in whole lines (so that one
        machine's never cuts into another's line), each after its label (by default its rank's, ranks.py),
        each exit status. A machine that cannot be reached leaves the others to run to their end, their
        output shown; its error is raised then."""
        labels = labels or [rank_label(rank, len(hosts)) for rank in range(len(hosts))]
        if len(hosts) == 1 and not labels[0]:
            return [await self.transport.stream(hosts[0], script(0), on_output)]
        sinks = [WholeLines(on_output, label) for label in labels]
        try:
            statuses = await asyncio.gather(*(self.transport.stream(host, script(rank), sinks[rank])
                                              for rank, host in enumerate(hosts)), return_exceptions=True)
        finally:
            for sink in sinks:
                sink.flush()
        if (failed := first_failure(statuses)) is not None:
            raise failed
        return [int(status) for status in statuses]

    async def set_idle_limit(self, handle: str, run_dir: str, idle_seconds: int) -> None:
        """On every machine of the allocation (each holder tells its own idleness)."""
        hosts, token = _hosts_and_token(handle)
        await asyncio.gather(*(self.transport.run(host, pooldev.idle_limit_script(_rank_token(token, rank, len(hosts)),
                                                                                  idle_seconds), timeout=JOB_TIMEOUT)
                               for rank, host in enumerate(hosts) if host in self.pool.hosts))

    async def exec_in(self, handle: str, run_dir: str, exec_id: str, num_nodes: int, accelerators_per_node: int,
                      envs: dict[str, str], run: str, on_output: OutputSink, setup: str = "",
                      gpus_claimed: int = 0) -> int:
        """`run` on every machine of the allocation at once; the lowest rank's failure is the status.
        Each machine runs `setup` first, and its `run` only if that succeeded. With `gpus_claimed`, it
        takes that many of the allocation's GPUs on each machine for itself (waiting while other execs
        hold them): on several machines one at a time, in rank order, so that two execs never each hold
        a machine the other waits for; every rank then starts at once."""
        hosts, token = _hosts_and_token(handle)
        several = bool(gpus_claimed) and len(hosts) > 1

        def script(rank: int) -> str:
            return pooldev.exec_script(_rank_token(token, rank, len(hosts)), exec_id, envs, run, setup,
                                       gpus_claimed, accelerators_per_node, wait_for_go=several)

        if not several:
            statuses = await self._on_every_machine(hosts, script, on_output)
        else:
            statuses = await self._exec_in_rank_order(handle, exec_id, script, on_output)
        if EXIT_NOT_READY in statuses:
            return EXIT_NOT_READY
        return next((s for s in statuses if s != 0), 0)

    async def _exec_in_rank_order(self, handle: str, exec_id: str, script: Callable[[int], str],
                                  on_output: OutputSink) -> list[int]:
        """Start each rank's script once the one before has its GPUs (its CLAIMED line), then let them
        all go (one more round trip per machine). A rank that ends before it has them (cancelled, the
        allocation gone) ends those started before it, which wait for the go."""
        hosts, token = _hosts_and_token(handle)
        running: list[asyncio.Future[int]] = []
        sinks = [WholeLines(on_output, rank_label(rank, len(hosts))) for rank in range(len(hosts))]
        try:
            for rank, host in enumerate(hosts):
                claimed = asyncio.Event()
                running.append(asyncio.ensure_future(
                    self.transport.stream(host, script(rank), _UntilLine(pooldev.CLAIMED, claimed.set, sinks[rank]))))
                said = asyncio.ensure_future(claimed.wait())
                await asyncio.wait({running[-1], said}, return_when=asyncio.FIRST_COMPLETED)
                said.cancel()
                if not claimed.is_set():
                    if rank:
                        await self.cancel_exec(handle, "", exec_id)
                    return list(await asyncio.gather(*running))
            await asyncio.gather(*(self.transport.run(host, pooldev.go_script(_rank_token(token, rank, len(hosts)),
                                                                               exec_id), timeout=JOB_TIMEOUT)
                                   for rank, host in enumerate(hosts)))
            return list(await asyncio.gather(*running))
        except BaseException:
            for started in running:
                started.cancel()
            raise
        finally:
            for sink in sinks:
                sink.flush()

    async def exec_output(self, handle: str, run_dir: str, exec_id: str, follow: bool, on_output: OutputSink,
                          tail: int = 0) -> None:
        """Every machine's, as `corral exec` showed it (_every_rank_output)."""
        hosts, token = _hosts_and_token(handle)
        await self._every_rank_output(hosts, lambda rank: pooldev.exec_output_script(
            _rank_token(token, rank, len(hosts)), exec_id, follow, tail), follow, on_output)

    async def cancel_exec(self, handle: str, run_dir: str, exec_id: str) -> None:
        hosts, token = _hosts_and_token(handle)
        await asyncio.gather(*(self.transport.run(host, pooldev.cancel_exec_script(_rank_token(token, rank, len(hosts)),
                                                                                   exec_id), timeout=JOB_TIMEOUT)
                               for rank, host in enumerate(hosts) if host in self.pool.hosts))

    async def release(self, handle: str | None, run_dir: str) -> None:
        if handle is None:
            return
        hosts, token = _hosts_and_token(handle)
        await asyncio.gather(*(self.transport.run(host, pooldev.release_script([_rank_token(token, rank, len(hosts))]),
                                                  timeout=JOB_TIMEOUT)
                               for rank, host in enumerate(hosts) if host in self.pool.hosts),
                             return_exceptions=True)  # a machine that is gone has released it already

    def _head(self, handle: str) -> tuple[str, str]:
        hosts, token = _hosts_and_token(handle)
        return hosts[0], _rank_token(token, 0, len(hosts))

    def shell_argv(self, handle: str, head_node: str, run_dir: str, command: str | None) -> list[str]:
        host, token = self._head(handle)
        options = ("-t", "-o", "BatchMode=no") if command is None else ()
        return self.transport.ssh_argv(host, [pooldev.shell_command(token, command)], options)

    def login_shell_command(self, handle: str, head_node: str, run_dir: str) -> str:
        host, token = self._head(handle)
        return shlex.join(["ssh", "-t", host, pooldev.shell_command(token, None)])

    async def ssh_route(self, name: str, handle: str, head_node: str, run_dir: str, sshd: bool) -> SshRoute:
        """The machine is reached directly, with its own ssh settings; the session is the shell above."""
        host, token = self._head(handle)
        return SshRoute(await self.transport.host_settings(host), None, pooldev.shell_command(token, None))

    async def fetch_dir(self, remote_dir: str, local_dir: Path) -> bool:
        """From the machine whose copy of `remote_dir` changed last (each machine is asked, in parallel:
        a task's checkpoints are on the machine it ran on, or on a home they share)."""
        host = await self._newest_copy(remote_dir)
        return False if host is None else await self.transport.fetch(host, remote_dir, local_dir)

    async def _newest_copy(self, remote_dir: str) -> str | None:
        """The machine whose copy of `remote_dir` changed last, each asked in parallel; None: none has it."""
        script = f'stat -c %Y "$HOME"/{shlex.quote(remote_dir.rstrip("/"))} 2>/dev/null || echo -\n'
        answers = await asyncio.gather(*(self.transport.run(h, script, timeout=15, check=False)
                                         for h in self.pool.hosts), return_exceptions=True)
        found = [(int(a.stdout.split()[0]), h) for h, a in zip(self.pool.hosts, answers)
                 if not isinstance(a, BaseException) and a.stdout.split()[:1] and a.stdout.split()[0].isdigit()]
        return max(found)[1] if found else None

    async def send_dir(self, remote_dir: str, target: Infra, destination: str) -> bool | None:
        """From the machine fetch_dir would fetch from, straight to a target that takes tar streams."""
        if not isinstance(target, TakesFolderStreams):
            return None
        host = await self._newest_copy(remote_dir)
        if host is None:
            return False
        transport, target_host = target.stream_target()
        try:
            return await self.transport.copy_to(host, remote_dir, transport, target_host, destination)
        except ClusterError as exc:
            if exc.cluster != host:
                raise
            raise ClusterError(self.pool.name, str(exc)) from None  # the pool's side failed, as the pool

    async def setup_failed(self, run_dir: str) -> bool:
        script = f'test -e "$HOME"/{shlex.quote(run_dir)}/setup_failed\n'
        for host in self.pool.hosts:  # the run dir is on one machine (or on a home they share)
            try:
                if (await self.transport.run(host, script, timeout=15, check=False)).exit_status == 0:
                    return True
            except CorralError:
                continue
        return False


def _allocation_state(hosts: list[str], ranks: list[list[str] | None], silent: dict[str, str],
                      said: list[str] | None = None) -> AllocationState:
    """An allocation's state from its ranks' lines (`pooldev.states_script`), with the execs over on
    every rank (the lowest rank's failure as the status, as `exec_in` gives it). `said`: per rank, what
    a failed setup printed last."""
    state = _phase(hosts, ranks, silent)
    if state.phase is AllocationPhase.FAILED and said:
        failed = next(i for i, r in enumerate(ranks) if r and r[4] != "-")
        state = replace(state, setup_output=said[failed])
    on_ranks = [dict(item.split(":", 1) for item in r[6].split(",") if item.count(":") == 1)
                if r and r[6] != "-" else {} for r in ranks]
    ended: dict[str, int] = {}
    for exec_id in set(on_ranks[0]) if on_ranks else set():
        codes = [rank.get(exec_id, "") for rank in on_ranks]
        if all(code.isdigit() for code in codes):
            ended[exec_id] = next((int(c) for c in codes if int(c) != 0), 0)
    ends = [int(r[7]) for r in ranks if r and r[7].isdigit()]
    live = state.phase in (AllocationPhase.STARTING, AllocationPhase.READY)
    left = slurm_time(min(ends) - time.time()) if ends and live else None
    return replace(state, ended_execs=ended, time_left=left)


def _phase(hosts: list[str], ranks: list[list[str] | None], silent: dict[str, str]) -> AllocationState:
    gone = [h for h in hosts if h in silent]
    if gone:
        return AllocationState(AllocationPhase.UNKNOWN, f"{gone[0]} does not answer ({silent[gone[0]]})", hosts,
                               None, None)
    if any(r is None for r in ranks):
        return AllocationState(AllocationPhase.ENDED, "its holder is gone", hosts, None, None)
    active = [float(r[3]) for r in ranks if r and r[3].isdigit()]
    last_active = max(active) if active else None
    failed = next((r for r in ranks if r and r[4] != "-"), None)
    if failed is not None:
        return AllocationState(AllocationPhase.FAILED, f"setup failed with exit code {failed[4]}", hosts, last_active,
                               None)
    if all(r and r[1] == "1" for r in ranks):
        ready = all(r and r[2] == "1" for r in ranks)
        return AllocationState(AllocationPhase.READY if ready else AllocationPhase.STARTING,
                               None if ready else "running setup", hosts, last_active, None)
    ended = next((r[5] for r in ranks if r and r[5] != "-"), "-")
    why = {"idle": "released after being idle", "down": "released (corral down)",
           "walltime": "walltime ended"}.get(
        ended, "its holder ended (the machine restarted, or the process was killed)")
    return AllocationState(AllocationPhase.ENDED, why, hosts, last_active, None)


class _UntilLine:
    """An output sink that passes output on, but for the first line equal to `line`: that one it keeps
    back, and calls `on_seen`. Until then whole lines pass (a part of a line waits for its end)."""

    def __init__(self, line: str, on_seen: Callable[[], None], on_output: OutputSink) -> None:
        self.line, self.on_seen, self.on_output = line.encode(), on_seen, on_output
        self.partial: bytes | None = b""  # None once seen: everything passes

    def __call__(self, chunk: bytes) -> None:
        if self.partial is None:
            self.on_output(chunk)
            return
        *lines, self.partial = (self.partial + chunk).split(b"\n")
        for i, line in enumerate(lines):
            if line == self.line:
                before, after = lines[:i], lines[i + 1:]
                if before:
                    self.on_output(b"\n".join(before) + b"\n")
                rest = b"".join(part + b"\n" for part in after) + self.partial
                self.partial = None
                self.on_seen()
                if rest:
                    self.on_output(rest)
                return
        if lines:
            self.on_output(b"\n".join(lines) + b"\n")
        if len(self.partial) > LINE_LIMIT:  # no line that long is the one awaited: let it through
            self.on_output(self.partial)
            self.partial = b""


NOT_FOUND = "-"  # a rank not found, in a partial task's handle (`_whole_tasks`)


def _hosts_and_token(handle: str) -> tuple[list[str], str]:
    """A handle's machines, rank 0 first, and its attempt token."""
    hosts, _, token = handle.partition("/")
    return [h for h in hosts.split(",") if h], token


def _rank_token(token: str, rank: int, nodes: int) -> str:
    """The run dir's name of one rank: the token itself for a single node, else `<token>.<rank>`."""
    return token if nodes == 1 else f"{token}.{rank}"


def _for_rank(remote: str, token: str, rank_token: str) -> str:
    """An upload into rank 0's run dir, redirected to this rank's."""
    for prefix in (f"{runner.RUNS_DIR}/{token}.0/", f"{runner.RUNS_DIR}/{token}/"):
        if remote.startswith(prefix):
            return f"{runner.RUNS_DIR}/{rank_token}/" + remote[len(prefix):]
    return remote


def _staged(remote: str, rank_token: str) -> str:
    """A file mount into a rank's workdir, redirected to its stage (runner.MOUNTS_STAGE)."""
    prefix = f"{runner.RUNS_DIR}/{rank_token}/workdir/"
    return (f"{runner.RUNS_DIR}/{rank_token}/{runner.MOUNTS_STAGE}/" + remote[len(prefix):]
            if remote.startswith(prefix) else remote)


def _combined(handle: str, token: str, parts: list[JobStatus]) -> JobStatus:
    """One task's status from its ranks': the first failure, else cancelled, running, or ended."""
    if len(parts) == 1:
        return replace(parts[0], handle=parts[0].handle if parts[0].moved else handle, token=token)
    starts = [p.started_at for p in parts if p.started_at]
    started = min(starts) if starts else None
    failed = next((p for p in parts if p.state is JobState.FAILED), None)
    if failed is not None:
        rank = parts.index(failed)
        return replace(failed, handle=handle, token=token, started_at=started,
                       reason=f"rank {rank}: {failed.reason or failed.native_state}"
                       + (f" (exit code {failed.exit_code})" if failed.exit_code else ""))
    if any(p.state is JobState.CANCELLED for p in parts):
        cancelled = next(p for p in parts if p.state is JobState.CANCELLED)
        return replace(cancelled, handle=handle, token=token, started_at=started)
    if any(p.state in (JobState.RUNNING, JobState.UNKNOWN) for p in parts):
        live = next(p for p in parts if p.state in (JobState.RUNNING, JobState.UNKNOWN))
        return replace(live, handle=handle, token=token, started_at=started, ended_at=None, exit_code=None)
    ends = [p.ended_at for p in parts if p.ended_at]
    return replace(parts[0], handle=handle, token=token, started_at=started, ended_at=max(ends) if ends else None)


def _node(pool: str, host: str, inventory: Inventory) -> Node:
    by_type: dict[str, list[Gpu]] = {}
    for gpu in inventory.gpus:
        by_type.setdefault(gpu.name, []).append(gpu)
    gpus = tuple(GpuPool(name, len(group), sum(1 for g in group if g.index in inventory.held))
                 for name, group in by_type.items())
    state = "mixed" if inventory.held or inventory.cpus_claimed else "idle"
    # A GPU task claims no core unless it asks (claims.cpus_wanted): a machine whose cores CPU tasks hold
    # still starts GPU tasks, so one core is left showing where it has GPUs (Node.gpus_free needs one).
    claimed = min(inventory.cpus - (1 if inventory.gpus else 0), inventory.cpus_claimed)
    used = max(inventory.memory_mb - inventory.memory_available_mb, inventory.memory_claimed_mb)
    return Node(host, (pool,), state, True, inventory.cpus, max(0, claimed), inventory.memory_mb,
                min(inventory.memory_mb, max(0, used)), gpus)


def _statuses(host: str, stdout: str) -> list[JobStatus]:
    out = []
    for line in stdout.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) < 5 or line.startswith(MARK):
            continue
        token, state, code, started, ended = parts[:5]
        start = float(started) if started.isdigit() else None
        end = float(ended) if ended.isdigit() else None
        exit_code = int(code) if code.lstrip("-").isdigit() else None
        handle = f"{host}/{token}"
        if state == "running":
            out.append(JobStatus(handle, token, JobState.RUNNING, "RUNNING", None, start, start, None, None))
        elif state == "ended":
            ok = exit_code == 0
            out.append(JobStatus(handle, token, JobState.SUCCEEDED if ok else JobState.FAILED,
                                 "COMPLETED" if ok else "FAILED", None, start, start, end, exit_code,
                                 failure=None if ok else FailureClass.TASK))
        elif state == "cancelled":
            out.append(JobStatus(handle, token, JobState.CANCELLED, "CANCELLED", None, start, start, end, exit_code))
        elif state == "timeout":
            out.append(JobStatus(handle, token, JobState.FAILED, "TIMEOUT", f"it reached its time limit on {host}",
                                 start, start, end, None, failure=FailureClass.TASK))
        elif state == "out_of_memory":
            used, _, limit = code.partition(":")
            out.append(JobStatus(handle, token, JobState.FAILED, "OUT_OF_MEMORY",
                                 f"it used {used} MB of memory on {host}, more than the {limit} MB it asked for",
                                 start, start, end, None, failure=FailureClass.TASK))
        elif state == "queued":
            ahead, wants = _queued_fields(parts)
            waits = f"waiting on {host} for {_wants_text(wants)}" + (f", {ahead} task(s) before it" if ahead else "")
            out.append(JobStatus(handle, token, JobState.PENDING, "QUEUED",
                                 f"{'Priority' if ahead else 'Resources'} ({waits})", None, None, None, None))
        elif state == "vanished":
            out.append(JobStatus(handle, token, JobState.FAILED, "VANISHED",
                                 f"its process on {host} is gone without an exit code (the machine restarted, or "
                                 "the process was killed)", start, start, time.time(), None,
                                 failure=FailureClass.INFRA))
    return out


def _answer_line(stdout: str) -> str:
    """A script's answer: its first `@@corral …` line ('' if none)."""
    return next((line for line in stdout.splitlines() if line.startswith(MARK + " ")), "")


def _rank_marks(stdout: str) -> dict[str, int]:
    """Rank token -> how many ranks its task has, from a status answer's `@@corral ranks` lines."""
    out: dict[str, int] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 4 and parts[:2] == [MARK, "ranks"] and parts[3].isdigit():
            out[parts[2]] = int(parts[3])
    return out


def _stray_ranks(task: JobStatus, found: dict[tuple[str, str], JobStatus]) -> list[tuple[str, str]]:
    """(machine, rank token) of the ranks still running of a multi-node task that failed or was
    cancelled on another rank: each must end too. `found`: each rank's status by (machine, rank token)."""
    hosts, token = _hosts_and_token(task.handle)
    if len(hosts) < 2 or task.state not in (JobState.FAILED, JobState.CANCELLED):
        return []
    ranks = [(host, _rank_token(token, rank, len(hosts))) for rank, host in enumerate(hosts) if host != NOT_FOUND]
    return [rank for rank in ranks if rank in found and found[rank].state is JobState.RUNNING]


def _whole_tasks(unnamed: dict[tuple[str, str], JobStatus], nodes: dict[str, tuple[str, int]]) -> list[JobStatus]:
    """The multi-node tasks among runs no handle names (a submission whose answer was lost, or that the
    server died before writing down), each as one status under its attempt's token: once every one of
    its ranks is found, handle and all, for the tracker to adopt it or cancel it where it runs. One found
    in part (a submission that died half-way, another replica's still starting its last rank, or a
    machine not answering) is `partial`, its handle naming the ranks found (NOT_FOUND for the others):
    the tracker cancels it once its attempt is settled as never sent, and never adopts it."""
    by_task: dict[str, dict[int, tuple[str, int]]] = {}
    for rank_token, (host, n) in nodes.items():
        token, _, rank = rank_token.rpartition(".")
        if rank.isdigit() and (host, rank_token) in unnamed:
            by_task.setdefault(token, {})[int(rank)] = (host, n)
    out = []
    for token, ranks in by_task.items():
        counts = {n for _, n in ranks.values()}
        if len(counts) != 1:
            continue  # ranks that disagree on their task's size are no task Corral started
        count = counts.pop()
        if not all(0 <= r < count for r in ranks):
            continue
        hosts = [ranks[r][0] if r in ranks else NOT_FOUND for r in range(count)]
        parts = [unnamed[(host, f"{token}.{r}")] for r, host in enumerate(hosts) if host != NOT_FOUND]
        combined = _combined(f"{','.join(hosts)}/{token}", token, parts)
        out.append(combined if len(ranks) == count else replace(combined, partial=True))
    return out


def _move_marks(stdout: str) -> dict[str, tuple[str, str, float | None]]:
    """token -> (`moving` or `moved`, the machine it goes or went to, since when) from a status answer."""
    out: dict[str, tuple[str, str, float | None]] = {}
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) == 5 and parts[1] in ("moving", "moved"):
            out[parts[0]] = (parts[1], parts[2], float(parts[3]) if parts[3].isdigit() else None)
    return out


def _queued(stdout: str) -> dict[str, tuple[int, Wants]]:
    """token -> (tasks ahead of it, what it waits for) for each queued task of a status answer."""
    out: dict[str, tuple[int, Wants]] = {}
    for line in stdout.splitlines():
        parts = line.split(maxsplit=5)
        if len(parts) >= 5 and parts[1] == "queued" and not line.startswith(MARK):
            out[parts[0]] = _queued_fields(parts)
    return out


def _queued_fields(parts: list[str]) -> tuple[int, Wants]:
    """A queued status line's `<ahead>:<gpus>:<cpus>:<memory MB>` and GPU type, split."""
    ahead, gpus, cpus, memory = [int(f) if f.isdigit() else 0 for f in (parts[2].split(":") + ["", "", ""])[:4]]
    return ahead, Wants(gpus, cpus, parts[5] if len(parts) > 5 else "", memory)


def _wants(request: JobRequest) -> Wants:
    gpus = request.accelerators_per_node
    return Wants(gpus, claims.cpus_wanted(request.cpus_per_node, gpus), request.accelerator_type or "",
                 max(0, request.memory_mb or 0))


def _same_kind(gpu_type: str, wanted: str) -> bool:
    """Does a GPU (or a claim) of `gpu_type` count for a request of `wanted` ('' on either side: any)?"""
    return not gpu_type or not wanted or gpu_type == wanted


def _of_kind(gpus: Sequence[Gpu], gpu_type: str) -> int:
    """How many of these GPUs count for a request of `gpu_type` ('' any)."""
    return sum(1 for g in gpus if _same_kind(g.name, gpu_type))


def _competes(waiting: Wants, wants: Wants) -> bool:
    """Would a task waiting in a machine's queue go before a new one (claims.drain): does it wait for
    what the new one wants?"""
    return bool((waiting.cpus and wants.cpus) or (waiting.memory_mb and wants.memory_mb)
                or (waiting.gpus and wants.gpus and _same_kind(waiting.gpu_type, wants.gpu_type)))


def _wants_text(wants: Wants) -> str:
    gpus = f"{normalize_gpu_name(wants.gpu_type)}:{wants.gpus}" if wants.gpu_type else f"{wants.gpus} GPU(s)"
    parts = ([gpus] if wants.gpus else []) + ([f"{wants.cpus} CPU(s)"] if wants.cpus else []) + (
        [f"{wants.memory_mb} MB of memory"] if wants.memory_mb else [])
    return " and ".join(parts) or "nothing"
