"""SshPoolInfra: a pool of plain machines behind the Infra seam (`ssh/<pool>`), each reached over ssh
with the transport's ControlMasters; nothing is installed on them.

- probe: one round trip per machine, in parallel (`inventory.py`); a machine that does not answer is a
  node that is down, with the reason; the pool is one place (`partition`) named as the pool.
- submit: the machines that have the GPUs free (as the last probe saw them), fullest first, so that
  tasks pack; on each in turn, the task's files, then one round trip that claims GPUs and starts it
  (`runner.submit_script`), until one accepts. A task runs on one machine (multi-node: not yet).
- status: one round trip per machine that has tasks. A machine that stops answering fails its tasks
  (an infrastructure failure, which the controller recovers elsewhere) once it has been silent for
  MACHINE_GRACE_SECONDS; before that, its tasks' state is UNKNOWN (nothing changes). The other
  machines' tasks are reported as usual: one machine down is not the pool down.
- cancel, logs: on the task's machine, named in its handle (`<host>/<token>`).
"""

from __future__ import annotations

import asyncio
import re
import shlex
import time
from collections.abc import Sequence
from pathlib import Path
from typing import ClassVar

from corral.config import PoolEntry
from corral.errors import ClusterError, ClusterUnreachableError, CorralError, ProbeParseError
from corral.infra.base import (
    AttemptFiles,
    ClusterSnapshot,
    FailureClass,
    GpuPool,
    Infra,
    JobRequest,
    JobState,
    JobStatus,
    Node,
    OutputSink,
    Partition,
    ReportsSetupFailure,
    SubmitResult,
)
from corral.infra.shell import render_env
from corral.infra.sshpool import runner
from corral.infra.sshpool.inventory import MARK, Gpu, Inventory, inventory_script, parse_inventory
from corral.ssh import SshTransport

JOB_TIMEOUT = 30
MACHINE_GRACE_SECONDS = 30.0
_RUN_DIR = re.compile(r"^\.corral/runs/([0-9a-f]{12}(?:\.[0-9]+)?)/")


def configured_gpus(spec: str) -> tuple[Gpu, ...]:
    """A pool config's `TYPE:N` for a machine without nvidia-smi."""
    name, _, count = spec.rpartition(":")
    return tuple(Gpu(i, name, None, None) for i in range(int(count)))


class SshPoolInfra(Infra, ReportsSetupFailure):
    kind: ClassVar[str] = "ssh"

    def __init__(self, pool: PoolEntry, transport: SshTransport):
        self.pool = pool
        self.transport = transport
        self._configured = {host: configured_gpus(spec) for host, spec in pool.gpus}
        self._inventories: dict[str, Inventory] = {}
        self._pending: dict[str, list[tuple[str, Path, str]]] = {}  # token -> uploads for its machine
        self._silent_since: dict[str, float] = {}

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
            warnings += answer.warnings
            nodes.append(_node(self.pool.name, host, answer))
        if not any(n.usable for n in nodes):
            reasons = "; ".join(n.reason or n.name for n in nodes)
            raise ClusterUnreachableError(self.pool.name, f"no machine of the pool answers ({reasons})")
        partition = Partition(self.pool.name, True, "UP", "UNLIMITED", 1, len(nodes))
        return ClusterSnapshot(self.pool.name, None, tuple(nodes), (partition,), kind="ssh",
                               probe_seconds=time.monotonic() - started, warnings=tuple(warnings))

    async def _inventory(self, host: str) -> Inventory:
        result = await self.transport.run(host, inventory_script(), timeout=self.transport.timeout)
        try:
            return parse_inventory(host, result.stdout, self._configured.get(host, ()))
        except ProbeParseError as exc:
            raise ProbeParseError(host, exc.detail) from None

    # ---- files ----------------------------------------------------------------------------------------
    def attempt_files(self, request: JobRequest) -> AttemptFiles:
        directory = runner.run_dir(request.token)
        return AttemptFiles(directory, (f"{directory}/log.txt",))

    async def upload(self, local: Path, remote: str) -> None:
        """Kept until the task's machine is chosen (submit); a path outside a run's folder goes to every
        machine of the pool at once."""
        match = _RUN_DIR.match(remote)
        if match:
            self._pending.setdefault(match.group(1), []).append(("file", Path(local), remote))
            return
        await asyncio.gather(*(self.transport.sync(host, Path(local), remote) for host in self.pool.hosts))

    async def upload_workdir(self, local: Path, cache_key: str, remote: str) -> None:
        await self.upload(local, remote + "/")

    # ---- jobs -----------------------------------------------------------------------------------------
    def _order(self, request: JobRequest) -> list[str]:
        """Machines to try: those the last probe saw with enough free GPUs of the type, fullest first
        (tasks pack, keeping whole machines free); then the others, which may have freed up."""
        def free(host: str) -> int:
            inventory = self._inventories.get(host)
            if inventory is None:
                return -1
            return sum(1 for g in inventory.free_gpus
                       if request.accelerator_type is None or g.name == request.accelerator_type)

        wanted = request.accelerators_per_node
        fits = sorted((h for h in self.pool.hosts if free(h) >= wanted), key=lambda h: (free(h), self.pool.hosts.index(h)))
        return fits + [h for h in self.pool.hosts if h not in fits]

    async def submit(self, request: JobRequest) -> SubmitResult:
        if request.num_nodes != 1:
            return SubmitResult(False, None, False, f"{self.name}: a task runs on one machine of a pool")
        files = {"job.sh": runner.job_script(request, self.pool.name), "env.sh": render_env(dict(request.envs)),
                 "setup.sh": request.setup or "", "run.sh": request.run or ""}
        why: list[str] = []
        for host in self._order(request):
            try:
                for _, local, remote in self._pending.get(request.token, []):
                    await self.transport.sync(host, local, remote)
                configured = [g.name for g in self._configured.get(host, ())]
                result = await self.transport.run(host, runner.submit_script(request, self.pool.name, files,
                                                                             configured), timeout=JOB_TIMEOUT)
            except ClusterError as exc:
                why.append(str(exc))
                continue
            answer = next((line for line in result.stdout.splitlines() if line.startswith(MARK + " ")), "")
            words = answer.split(maxsplit=3)
            if words[1:2] == ["submitted"] and len(words) >= 3:
                self._pending.pop(request.token, None)
                return SubmitResult(True, words[2], len(words) > 3 and words[3] == "existing", "")
            why.append(answer.removeprefix(f"{MARK} rejected ").strip() or f"{host}: no answer")
        return SubmitResult(False, None, False, f"no machine of {self.name} can start it now ({'; '.join(why)})")

    async def status(self, handles: list[str], accounts: Sequence[str] = ()) -> list[JobStatus]:
        by_host: dict[str, list[str]] = {}
        for handle in handles:
            host, _, token = handle.partition("/")
            if host in self.pool.hosts and token:
                by_host.setdefault(host, []).append(runner.check_token(token))
        answers = await asyncio.gather(*(self.transport.run(h, runner.status_script(t), timeout=JOB_TIMEOUT)
                                         for h, t in by_host.items()), return_exceptions=True)
        out: list[JobStatus] = []
        now = time.time()
        for (host, tokens), answer in zip(by_host.items(), answers):
            if isinstance(answer, BaseException):
                if not isinstance(answer, ClusterError):
                    raise answer
                since = self._silent_since.setdefault(host, now)
                if now - since < MACHINE_GRACE_SECONDS:
                    out += [JobStatus(f"{host}/{t}", t, JobState.UNKNOWN, "NO_ANSWER",
                                      f"{host} does not answer ({answer.detail})", None, None, None, None)
                            for t in tokens]
                    continue
                out += [JobStatus(f"{host}/{t}", t, JobState.FAILED, "MACHINE_DOWN",
                                  f"{host} has not answered for {now - since:.0f} s ({answer.detail})", None, None, now,
                                  None, failure=FailureClass.INFRA) for t in tokens]
                continue
            self._silent_since.pop(host, None)
            out += _statuses(host, answer.stdout)
        return out

    async def cancel(self, handles: list[str], run_dirs: list[str]) -> None:
        by_host: dict[str, list[str]] = {}
        for handle in handles:
            host, _, token = handle.partition("/")
            if host in self.pool.hosts and token:
                by_host.setdefault(host, []).append(runner.check_token(token))
        await asyncio.gather(*(self.transport.run(h, runner.cancel_script(t), timeout=JOB_TIMEOUT)
                               for h, t in by_host.items()))

    async def logs(self, handle: str, log_path: str, follow: bool, on_output: OutputSink) -> None:
        host, _, token = handle.partition("/")
        if host not in self.pool.hosts:
            raise CorralError(f"{self.name}: {host!r} is not one of its machines (any more)")
        await self.transport.stream(host, runner.follow_script(token, follow), on_output)

    async def setup_failed(self, run_dir: str) -> bool:
        script = f'test -e "$HOME"/{shlex.quote(run_dir)}/setup_failed\n'
        for host in self.pool.hosts:  # the run dir is on one machine (or on a home they share)
            try:
                if (await self.transport.run(host, script, timeout=15, check=False)).exit_status == 0:
                    return True
            except CorralError:
                continue
        return False


def _node(pool: str, host: str, inventory: Inventory) -> Node:
    by_type: dict[str, list[Gpu]] = {}
    for gpu in inventory.gpus:
        by_type.setdefault(gpu.name, []).append(gpu)
    gpus = tuple(GpuPool(name, len(group), sum(1 for g in group if g.index in inventory.held))
                 for name, group in by_type.items())
    state = "mixed" if inventory.held else "idle"
    return Node(host, (pool,), state, True, inventory.cpus, 0, inventory.memory_mb,
                max(0, inventory.memory_mb - inventory.memory_available_mb), gpus)


def _statuses(host: str, stdout: str) -> list[JobStatus]:
    out = []
    for line in stdout.splitlines():
        parts = line.split()
        if len(parts) != 5 or line.startswith(MARK):
            continue
        token, state, code, started, ended = parts
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
        elif state == "vanished":
            out.append(JobStatus(handle, token, JobState.FAILED, "VANISHED",
                                 f"its process on {host} is gone without an exit code (the machine restarted, or "
                                 "the process was killed)", start, start, time.time(), None,
                                 failure=FailureClass.INFRA))
    return out
