"""SlurmInfra: one Slurm cluster behind its login node, the first implementation of the Infra seam.

Every operation is one SSH round trip over the cluster's ControlMaster (see `ssh.py`): the probe,
a submission (files written and `sbatch` in one script), a batched status (`squeue` plus `sacct`
for what squeue forgot; first `squeue --only-job-state` where the site has it, which ends the round
trip when nothing changed), a cancel, a prediction for many requests (`sbatch --test-only` in parallel).
"""

from __future__ import annotations

import math
import shlex
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, ClassVar

from corral import budget
from corral.errors import CorralError, ProbeParseError, SlurmControllerError
from corral.infra.base import (
    AllocationPhase,
    AllocationState,
    AttemptFiles,
    ClusterSnapshot,
    CopiesCheckpoints,
    EndedRun,
    FollowsSetup,
    HoldsAllocations,
    Infra,
    JobRequest,
    JobStatus,
    OutputSink,
    PredictsStart,
    PrunesWorkdirCaches,
    ReleasesHeld,
    HostsJobGroups,
    RemovesRunFiles,
    ReportsSetupFailure,
    RunsArrays,
    RunsJobScripts,
    SessionKeys,
    SshRoute,
    TakesFolderStreams,
    SubmitResult,
)
from corral.infra import caches
from corral.infra.shell import remove_group_dirs_script
from corral.infra.slurm import devscript, userscript
from corral.infra.slurm.environment import PRELUDE
from corral.infra.slurm.jobs import (
    cancel_script,
    follow_script,
    parse_status,
    parse_submit,
    parse_test_only,
    release_script,
    remove_env_script,
    remove_run_dirs_script,
    status_lines_for,
    status_script,
    stopped_at_ping,
    test_only_script,
)
from corral.infra.slurm.jobscript import spec_for, submit_script
from corral.infra.slurm.probe import QUERIES, probe_script, read_probe
from corral.ssh import RemoteResult, SshTransport, remote_path

# What the login node keeps for itself out of the transport's timeout: connecting and answering.
_SSH_MARGIN = 3
_FACTS_NOTE = "slurm-probe-facts"  # the probe's FACTS sections, in the transport's login notes
JOB_TIMEOUT = 30  # seconds for a submission, a status query, a cancel (sbatch may wait on a busy controller)
# With the light query, a full one still runs at least this often (seconds): a pending job's reason and
# predicted start change without its state.
FULL_STATUS_EVERY = 60.0


class SlurmInfra(Infra, PredictsStart, RunsArrays, CopiesCheckpoints, ReportsSetupFailure, HoldsAllocations,
                 FollowsSetup, ReleasesHeld, RemovesRunFiles, HostsJobGroups, PrunesWorkdirCaches, RunsJobScripts,
                 TakesFolderStreams):
    kind: ClassVar[str] = "slurm"
    probe_commands: ClassVar[int] = 1 + len(QUERIES)  # scontrol ping, and the queries (sinfo, squeue, …)
    status_commands: ClassVar[int] = 2  # squeue, and sacct for what it forgot
    max_array_size: ClassVar[int] = 1000  # Slurm's default MaxArraySize is 1001 (indices 0-1000)

    def __init__(self, cluster: str, transport: SshTransport):
        self.cluster = cluster
        self.transport = transport
        # Slurm's commands get what is left of the one timeout once ssh has had its share.
        self.slurm_timeout = max(1, math.floor(transport.timeout) - _SSH_MARGIN)
        # The last status query's lines, parsed (most come again), shared with the process's other Infras
        self._status_lines = status_lines_for(cluster, transport.login.user if transport.login else "")

    @property
    def name(self) -> str:
        return f"slurm/{self.cluster}"

    async def _run(self, script: str, **options: Any) -> RemoteResult:
        """A script on the login node, without what the user's environment would change in Slurm's
        commands (environment.PRELUDE)."""
        return await self.transport.run(self.cluster, PRELUDE + script, **options)

    async def _stream(self, script: str, on_output: Callable[[bytes], None]) -> int:
        return await self.transport.stream(self.cluster, PRELUDE + script, on_output)

    async def probe(self, *, associations: bool = False, paths: tuple[str, ...] = (),
                    filesystems: tuple[str, ...] = ()) -> ClusterSnapshot:
        # One bound for the whole answer, a new connection included.
        # The login node's facts are asked for once per login environment (`check` always asks).
        notes = self.transport.login_notes(self.cluster)
        known = None if associations or notes is None else notes.get(_FACTS_NOTE)
        script = probe_script(self.slurm_timeout, associations=associations, paths=paths, filesystems=filesystems,
                              facts=known is None)
        commands = self.probe_commands + (1 if associations else 0)  # sacctmgr too, for check
        result = await self._run(script, timeout=self.transport.timeout, cost=commands)
        snapshot, facts = read_probe(self.cluster, result.stdout, self.slurm_timeout, result.seconds, known)
        if known is None and (notes := self.transport.login_notes(self.cluster)) is not None:
            notes[_FACTS_NOTE] = facts  # the environment this call learned, or the one it ran in
        return snapshot

    def attempt_files(self, request: JobRequest) -> AttemptFiles:
        if userscript.is_script_request(request):
            submission = userscript.submission_for(request, self.cluster)
            return AttemptFiles(submission.run_dir, submission.log_paths, submission.error_paths)
        spec = spec_for(request, self.cluster)
        logs = (tuple(spec.log_path(i) for i in range(len(request.task_ids))) if spec.is_array
                else (spec.log_path(None),))
        return AttemptFiles(spec.run_dir, logs)

    async def upload(self, local: Path, remote: str, token: str | None = None) -> None:
        await self.transport.sync(self.cluster, local, remote)

    async def workdir_upload_size(self, local: Path, cache_key: str) -> int | None:
        return await caches.lacks(self.transport, self.cluster, local, cache_key)

    async def upload_workdir(self, local: Path, cache_key: str, remote: str) -> None:
        """rsync into `~/.corral/cache/<key>` (a mirror of the last workdir sent from the same folder, so
        only changes travel; its use marked, caches.py), then a hard-linked copy into the attempt's
        folder: one more round trip, no data. A file the job rewrites in place is sent again next
        time; the attempt keeps its copy."""
        cache = caches.cache_path(cache_key)
        await caches.sync_into(self.transport, self.cluster, local, cache_key)
        source, target = remote_path(cache), remote_path(remote)
        script = (f"mkdir -p {target} && {{ cp -al {source}/. {target}/ 2>/dev/null "
                  f"|| cp -a {source}/. {target}/; }}\n")
        await self._run(script, timeout=JOB_TIMEOUT)

    async def submit(self, request: JobRequest) -> SubmitResult:
        script = (userscript.submit_script(request, self.cluster) if userscript.is_script_request(request)
                  else submit_script(spec_for(request, self.cluster)))
        result = await self._run(script, timeout=JOB_TIMEOUT)
        try:
            return parse_submit(result.stdout)
        except ProbeParseError as exc:
            raise ProbeParseError(self.cluster, exc.detail) from None

    async def status(self, handles: list[str], accounts: Sequence[str] = (), *, others: bool = True
                     ) -> list[JobStatus]:
        """Where the site's squeue has `--only-job-state`, the light query goes first; when the tracked
        jobs' ids and states are as at the last full query (under FULL_STATUS_EVERY ago, and `others`
        not needed), that query's statuses are the answer and the full one does not run. After a query
        that failed, `scontrol ping` goes first, and a controller that is not UP ends the query there
        (SlurmControllerError) in milliseconds rather than after squeue's retries."""
        lines = self._status_lines
        light = None
        if lines.light is not False:
            fresh = not others and lines.digest and time.monotonic() - lines.full_at < FULL_STATUS_EVERY
            light = lines.digest if fresh else ""
        ping_first, lines.failed = lines.failed, True
        cost = self.status_commands + (light is not None) + ping_first
        script = status_script(handles, accounts=accounts, unless_unchanged=light,
                               ping_within=self.slurm_timeout if ping_first else None)
        result = await self._run(script, timeout=JOB_TIMEOUT, cost=cost, poll=True)
        try:
            statuses = parse_status(self.cluster, result.stdout, lines, now=time.monotonic(), asked=light)
        except SlurmControllerError:
            if ping_first and stopped_at_ping(result.stdout):
                budget.give_back(self.cluster, cost - 1)  # only the ping ran
            raise
        lines.failed = False
        if lines.light_only:
            budget.give_back(self.cluster, self.status_commands)  # squeue's full query and sacct did not run
        elif light is not None and lines.light is False:
            budget.give_back(self.cluster, 1)  # the light query did not reach the controller
        return statuses

    async def cancel(self, handles: list[str], run_dirs: list[str]) -> None:
        if handles:
            await self._run(cancel_script(handles, run_dirs), timeout=JOB_TIMEOUT)

    async def remove_env_files(self, ended: list[EndedRun]) -> None:
        if ended:  # one shared filesystem: the run directory names them all; no Slurm command
            await self._run(remove_env_script([e.run_dir for e in ended]), timeout=JOB_TIMEOUT, cost=0)

    async def remove_run_dirs(self, ended: list[EndedRun]) -> None:
        if ended:
            await self._run(remove_run_dirs_script([e.run_dir for e in ended]), timeout=JOB_TIMEOUT, cost=0)

    async def remove_group_files(self, group_ids: list[str]) -> None:
        if group_ids:
            await self._run(remove_group_dirs_script(group_ids), timeout=JOB_TIMEOUT, cost=0)

    async def prune_workdir_caches(self, keep_days: float) -> int:
        result = await self._run(caches.prune_script(keep_days), timeout=JOB_TIMEOUT * 4, cost=0)
        return caches.read_pruned(result.stdout)

    async def release_held(self, handles: list[str]) -> None:
        if handles:
            await self._run(release_script(handles), timeout=JOB_TIMEOUT)

    async def logs(self, handle: str, log_path: str, follow: bool, on_output: OutputSink, tail: int = 0) -> None:
        await self._stream(follow_script(log_path, handle, follow, tail), on_output)

    async def predict(self, requests: list[JobRequest]) -> list[tuple[float | None, str]]:
        if not requests:
            return []
        result = await self._run(test_only_script(requests, self.cluster), timeout=JOB_TIMEOUT)
        return parse_test_only(result.stdout, len(requests))

    def script_for(self, request: JobRequest) -> tuple[str, str]:
        """A job script's text as this cluster would receive it, and the sbatch command line (dry runs)."""
        submission = userscript.submission_for(request, self.cluster)
        return submission.text, submission.command()

    @staticmethod
    def array_handle(handle: str, index: int) -> str:
        return f"{handle}_{index}"

    @staticmethod
    def array_index(handle: str) -> int | None:
        index = handle.partition("_")[2]
        return int(index) if index.isdigit() else None

    async def fetch_dir(self, remote_dir: str, local_dir: Path) -> bool:
        return await self.transport.fetch(self.cluster, remote_dir, local_dir)

    async def send_dir(self, remote_dir: str, target: Infra, destination: str) -> bool | None:
        if not isinstance(target, TakesFolderStreams):
            return None
        transport, host = target.stream_target()
        return await self.transport.copy_to(self.cluster, remote_dir, transport, host, destination)

    def stream_target(self) -> tuple[SshTransport, str]:
        return self.transport, self.cluster

    async def setup_failed(self, run_dir: str) -> bool:
        # task.sh leaves this marker when setup exits non-zero.
        script = f'test -e "$HOME"/{shlex.quote(run_dir)}/setup_failed\n'
        try:
            result = await self._run(script, timeout=15, check=False)
        except CorralError:
            return False
        return result.exit_status == 0

    # ---- dev allocations ----------------------------------------------------------------------
    async def hold(self, request: JobRequest, idle_seconds: int, session_keys: SessionKeys) -> SubmitResult:
        spec = spec_for(request, self.cluster)
        script = devscript.holder_submit_script(spec, idle_seconds, request.envs, request.setup, session_keys)
        result = await self._run(script, timeout=JOB_TIMEOUT)
        return parse_submit(result.stdout)

    async def allocation_states(self, held: list[tuple[str, str]]) -> dict[str, AllocationState]:
        if not held:
            return {}
        try:
            result = await self._run(devscript.status_script(held), timeout=20)
        except CorralError as exc:
            return {handle: AllocationState(AllocationPhase.UNKNOWN, str(exc), [], None, None) for handle, _ in held}
        return {handle: devscript.parse_allocation_status(handle, result.stdout) for handle, _ in held}

    async def set_idle_limit(self, handle: str, run_dir: str, idle_seconds: int) -> None:
        await self._run(devscript.idle_limit_script(run_dir, idle_seconds), timeout=JOB_TIMEOUT)

    async def exec_in(self, handle: str, run_dir: str, exec_id: str, num_nodes: int, accelerators_per_node: int,
                      envs: dict[str, str], run: str, on_output: OutputSink, setup: str = "",
                      gpus_claimed: int = 0) -> int:
        script = devscript.exec_script(run_dir, handle, exec_id, num_nodes, accelerators_per_node, self.cluster,
                                       envs, run, setup, gpus_claimed)
        return await self._stream(script, on_output)

    async def exec_output(self, handle: str, run_dir: str, exec_id: str, follow: bool, on_output: OutputSink,
                          tail: int = 0) -> None:
        await self._stream(devscript.exec_output_script(run_dir, handle, exec_id, follow, tail), on_output)

    async def setup_output(self, handle: str, run_dir: str, on_output: OutputSink) -> None:
        await self._stream(devscript.setup_output_script(run_dir, handle), on_output)

    async def cancel_exec(self, handle: str, run_dir: str, exec_id: str) -> None:
        await self._run(devscript.cancel_exec_script(run_dir, handle, exec_id), timeout=JOB_TIMEOUT)

    async def release(self, handle: str | None, run_dir: str) -> None:
        await self._run(devscript.down_script(handle, run_dir), timeout=JOB_TIMEOUT)

    def shell_argv(self, handle: str, head_node: str, run_dir: str, command: str | None) -> list[str]:
        remote = devscript.shell_command(handle, head_node, run_dir, command)
        # An interactive shell may prompt (a password, MFA): the one place Corral lifts BatchMode.
        options = ("-t", "-o", "BatchMode=no") if command is None else ()
        return self.transport.ssh_argv(self.cluster, [remote], options)

    def login_shell_command(self, handle: str, head_node: str, run_dir: str) -> str:
        return devscript.shell_command(handle, head_node, run_dir, None)

    async def ssh_route(self, name: str, handle: str, head_node: str, run_dir: str, sshd: bool) -> SshRoute:
        settings = await self.transport.host_settings(self.cluster)
        proxy = None
        if sshd:
            proxy = self.transport.ssh_argv(
                self.cluster, [devscript.session_proxy_command(name, handle, head_node, run_dir)])
        return SshRoute(settings, proxy, devscript.shell_command(handle, head_node, run_dir, None))
