"""The Infra seam: the one interface every backend implements, and the generic types that cross it.

An Infra is one place that can run work (`slurm/<cluster>`; later `k8s/<context>`, `ssh/<pool>`). Like
submitit's `Executor` and dstack's `Compute`, the base is narrow: `probe` (a capacity snapshot),
`submit` (a generic request in, an opaque handle out), `status` (many handles, one round trip),
`cancel` and `logs`. What only some backends can do is a capability mixin that callers test with
`isinstance`: `PredictsStart`, `RunsArrays`, `HoldsAllocations`, `CopiesCheckpoints`,
`RunsJobScripts`. Statuses carry a
generic `JobState` and `FailureClass`, so that rules above the seam never read a backend's words.
Nothing outside `corral/infra/` imports a backend's module (a test asserts it); `connect` makes one.
"""

from __future__ import annotations

import enum
import secrets
from abc import ABC, abstractmethod
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

from corral.errors import CorralError


@dataclass(frozen=True)
class GpuPool:
    """GPUs of one GRES type on one node. `gres_type` None is an untyped `gpu:N`."""

    gres_type: str | None
    total: int
    used: int


@dataclass(frozen=True)
class Node:
    name: str
    partitions: tuple[str, ...]
    state: str  # the scheduler's word for it, e.g. "idle", "mixed", "drained", "down*"
    usable: bool  # up and accepting new work
    cpus_total: int
    cpus_alloc: int
    memory_mb: int
    memory_alloc_mb: int
    gpus: tuple[GpuPool, ...] = ()
    reason: str | None = None
    features: tuple[str, ...] = ()  # Slurm node features (what --constraint matches); Slurm only

    @property
    def cpus_free(self) -> int:
        return self.cpus_total - self.cpus_alloc if self.usable else 0

    def gpus_free(self, gres_type: str | None) -> int:
        """GPUs of this type a new job could get now: none on an unusable or CPU-full node."""
        if not self.usable or self.cpus_free <= 0:
            return 0
        return sum(max(0, p.total - p.used) for p in self.gpus if p.gres_type == gres_type)


@dataclass(frozen=True)
class Partition:
    name: str
    default: bool
    state: str  # UP, DOWN, DRAIN, INACTIVE
    max_time: str
    max_nodes: int | None
    total_nodes: int

    @property
    def up(self) -> bool:
        return self.state.upper() == "UP"


@dataclass(frozen=True)
class PendingDemand:
    """GPUs asked for by one pending job, in the partitions it may run in."""

    partitions: tuple[str, ...]
    gres_type: str | None
    gpus: int


# Filesystem types (stat -f -c %T) that compute nodes share with the login node.
SHARED_FILESYSTEMS = frozenset({"nfs", "nfs4", "lustre", "gpfs", "beegfs", "cephfs", "ceph", "panfs", "wekafs",
                                "fuse", "smb2", "cifs", "glusterfs", "vast"})


def shared_filesystem(kind: str | None) -> bool | None:
    """Is a filesystem of this type (stat -f -c %T) one the compute nodes share? None if unknown."""
    return kind.lower().split(".")[0] in SHARED_FILESYSTEMS if kind else None


@dataclass(frozen=True)
class ClusterSnapshot:
    """What one probe saw on one cluster."""

    cluster: str
    slurm_version: str | None
    nodes: tuple[Node, ...]
    partitions: tuple[Partition, ...]
    pending: tuple[PendingDemand, ...] = ()
    container_runtimes: tuple[str, ...] = ()  # pyxis (srun --container-image), apptainer, singularity
    accounts: tuple[str, ...] | None = None  # the user's accounts, when asked and known (probe(associations=))
    qos: tuple[str, ...] | None = None  # the QOS those accounts allow, likewise
    home_filesystem: str | None = None  # the home's filesystem type (stat -f): nfs, lustre, gpfs, ext2/ext3, …
    existing_paths: frozenset[str] | None = None  # of the paths asked about (probe(paths=)), those that exist
    path_filesystems: Mapping[str, str] = field(default_factory=dict)  # probe(filesystems=): path -> type
    kind: str = "slurm"  # the Infra's kind: `slurm`, `ssh` (a pool: its machines are the nodes, one partition)

    @property
    def home_shared(self) -> bool | None:
        """Is the home on a network filesystem (so every node sees a job's files)? None if unknown."""
        return shared_filesystem(self.home_filesystem)
    probe_seconds: float = 0.0
    warnings: tuple[str, ...] = field(default_factory=tuple)

    def nodes_in(self, partition: str) -> list[Node]:
        return [n for n in self.nodes if partition in n.partitions]

    @property
    def gpu_types(self) -> list[str]:
        return sorted({p.gres_type for n in self.nodes for p in n.gpus if p.gres_type})


class JobState(enum.StrEnum):
    """A job attempt's state, whatever runs it."""

    SUBMITTING = "SUBMITTING"  # recorded, not yet accepted (or its answer was lost)
    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    CANCELLING = "CANCELLING"  # cancel decided, not yet confirmed by the backend
    CANCELLED = "CANCELLED"
    SUBMIT_FAILED = "SUBMIT_FAILED"
    LOST = "LOST"  # the backend no longer knows the job
    UNKNOWN = "UNKNOWN"


LIVE_STATES = frozenset({JobState.PENDING, JobState.STARTING, JobState.RUNNING})
TERMINAL_JOB_STATES = frozenset({JobState.SUCCEEDED, JobState.FAILED, JobState.CANCELLED, JobState.SUBMIT_FAILED,
                                 JobState.LOST})


class FailureClass(enum.StrEnum):
    """Why an attempt did not succeed, in the terms the controller's rules need."""

    TASK = "task"  # the task itself failed (its exit code, its memory, its walltime)
    INFRA = "infra"  # the infrastructure failed it: a node died, it was preempted, a node did not boot
    REJECTED = "rejected"  # the backend refused the submission: it holds no copy of the job
    LOST = "lost"  # the backend no longer knows the job, or its submission's answer never came


@dataclass(frozen=True)
class JobStatus:
    """One job (or array task) as a backend's batched status query saw it."""

    handle: str  # opaque to everything above the seam (a Slurm job id such as "123" or "123_4")
    token: str | None  # the attempt token the backend found on the job, for Corral's own jobs
    state: JobState
    native_state: str  # the backend's own word, shown to people (e.g. NODE_FAIL)
    reason: str | None
    submitted_at: float | None
    started_at: float | None
    ended_at: float | None
    exit_code: int | None
    expected_start: float | None = None  # a pending job's: the scheduler's own estimate
    failure: FailureClass | None = None  # set when state is FAILED
    moved: bool = False  # the infra moved the job (a pool's waiting task to another machine): `handle` is new
    # Only part of the job was found (a multi-node task some of whose ranks never started): Corral may
    # cancel it through `handle`, which names the parts found, but never adopts it as its attempt.
    partial: bool = False


@dataclass(frozen=True)
class SubmitResult:
    accepted: bool
    handle: str | None  # for an array: the array's handle; task i's is `array_handle(handle, i)`
    already_existed: bool  # a retried submission found the job its first try made
    message: str  # why it was refused


@dataclass(frozen=True)
class JobRequest:
    """One submission (one job, or one array of copies), in generic terms."""

    token: str  # unique per attempt; the backend puts it on the job so a lost answer can be found again
    task_ids: tuple[str, ...]  # one Corral job id per copy (one element: not an array)
    place: str  # where inside the infra (a Slurm partition)
    num_nodes: int
    accelerator_type: str | None  # as the place spells it (a GRES type), None for untyped or none
    accelerators_per_node: int
    cpus_per_node: int | None
    memory_mb: int | None
    envs: dict[str, str]
    setup: str | None
    run: str | None
    first_rank: int = 0  # CORRAL_JOB_RANK of copy 0
    num_jobs: int = 1  # CORRAL_NUM_JOBS
    extra_env: dict[str, str] = field(default_factory=dict)
    checkpoint_dir: str | None = None  # relative to the user's home, or DEFAULT_CHECKPOINT_DIR
    # The task's own section for this kind of infra (for Slurm, `slurm:`: time, account, qos, …).
    scheduler_options: Mapping[str, Any] = field(default_factory=dict)
    requeue: bool = True  # may the infra requeue the job itself (False: Corral's controller recovers it)
    held: bool = False  # queued but not to start until released (see ReleasesHeld)
    container_image: str | None = None  # an OCI image (docker.io/library/ubuntu:22.04 or ubuntu:22.04)
    container_runtime: str | None = None  # one the snapshot listed (placement.CONTAINER_RUNTIMES)
    # How the infra numbers the copies when the task fixes it (a job script's --array indices), one per
    # task id; empty: 0, 1, 2, …
    copy_indices: tuple[int, ...] = ()
    # The walltime, counted from the start (setup included), for infras that enforce it themselves (a
    # pool's machines, Kubernetes); Slurm takes `time` from scheduler_options. None: no limit.
    time_limit_seconds: int | None = None

    def copy_index(self, position: int) -> int:
        return self.copy_indices[position] if self.copy_indices else position

    @property
    def is_array(self) -> bool:
        """Submitted as an array: several copies, or copies the task numbers itself (even one of them)."""
        return len(self.task_ids) > 1 or bool(self.copy_indices)


@dataclass(frozen=True)
class AttemptFiles:
    """Where an attempt's files will be on the infra, known before it is submitted (so that the
    attempt can be recorded first): its run directory and one log per copy; where stderr goes to a file
    apart (an sbatch script's `--error`), that file per copy."""

    run_dir: str
    log_paths: tuple[str, ...]
    error_paths: tuple[str, ...] = ()


OutputSink = Callable[[bytes], None]
# A managed job's checkpoint folder when the task names none: the backend's own per-job default.
DEFAULT_CHECKPOINT_DIR = "@default"


def new_token() -> str:
    """An attempt's token: 48 random bits, put on the job so that a lost answer can be found again."""
    return secrets.token_hex(6)


class Infra(ABC):
    """One place that runs work."""

    kind: ClassVar[str]
    # What a probe and a status query spend of the place's budget of commands a minute (budget.py).
    probe_commands: ClassVar[int] = 1
    status_commands: ClassVar[int] = 1
    # Corral is the place's scheduler (an SSH pool): a task it declared failed because a machine stopped
    # answering may still run there, cut off; found running once the machine answers again, it is ended
    # (tracker.py), as slurmd ends a job it no longer knows once its node is back.
    ends_what_it_declared_failed: ClassVar[bool] = False

    @property
    @abstractmethod
    def name(self) -> str:
        """`<kind>/<name>`, e.g. `slurm/alpine`."""

    @abstractmethod
    async def probe(self, *, associations: bool = False, paths: tuple[str, ...] = (),
                    filesystems: tuple[str, ...] = ()) -> ClusterSnapshot:
        """Everything placement needs, in one round trip. Raises ClusterError. `associations`: in the
        same round trip, the accounts and QOS the user may submit with, where the backend has such
        things (`ClusterSnapshot.accounts`/`qos`; for `corral check`, not for placement). `paths`
        (task.SAFE_PATH): which exist where jobs would see them (`existing_paths`); `filesystems`:
        the filesystem type of each (`path_filesystems`; `corral check`, for profiles' paths)."""

    @abstractmethod
    def attempt_files(self, request: JobRequest) -> AttemptFiles:
        """Where `submit` will put the request's files and logs (pure: no I/O)."""

    @abstractmethod
    async def upload(self, local: Any, remote: str, token: str | None = None) -> None:
        """Copy a local file or folder's contents to `remote` (relative to the user's home there), so
        that the job sees it; only what changed travels where the backend can tell. `token`: the
        submission the files go with (its request's token), for a backend whose files travel with the
        submission itself (Kubernetes: in its ConfigMap); None where `remote` is in its folder."""

    async def workdir_upload_size(self, local: Any, cache_key: str) -> int | None:
        """How many bytes `upload_workdir` would send now, given what the infra's cache holds (None:
        it cannot tell; then count the whole workdir). For `--dryrun` only: it may cost a round trip."""
        return None

    async def upload_workdir(self, local: Any, cache_key: str, remote: str) -> None:
        """A task's workdir, as `remote` (an attempt's own folder). Backends that can keep a per-task
        cache sync into it (only changes travel) and copy from it; by default, a plain upload."""
        await self.upload(local, remote + "/")

    @abstractmethod
    async def submit(self, request: JobRequest) -> SubmitResult:
        """Submit, idempotently: a request whose token the infra already holds is not submitted twice."""

    @abstractmethod
    async def status(self, handles: list[str], accounts: Sequence[str] = (), *, others: bool = True
                     ) -> list[JobStatus]:
        """The statuses of these handles and of every job the infra shows for this connection's user
        and the other `accounts` (a team server's members there), matched by token, in one round trip.
        With `others` False the caller needs only the handles' statuses: an infra that can tell cheaply
        that none of them changed may answer with its last statuses (Slurm's light query)."""

    @abstractmethod
    async def cancel(self, handles: list[str], run_dirs: list[str]) -> None:
        """Cancel these jobs; each job's run dir gets the cancel fence first (see the backend)."""

    @abstractmethod
    async def logs(self, handle: str, log_path: str, follow: bool, on_output: OutputSink, tail: int = 0) -> None:
        """A job's output (with `tail` > 0, its last `tail` lines only); with `follow`, then what comes
        until the job ends."""


class PredictsStart(ABC):
    """The infra can say when a job would start (Slurm: `sbatch --test-only`)."""

    @abstractmethod
    async def predict(self, requests: list[JobRequest]) -> list[tuple[float | None, str]]:
        """(predicted start in epoch seconds or None, the infra's words) per request, one round trip."""


class RunsArrays(ABC):
    """The infra submits many copies of one task as one array job."""

    max_array_size: ClassVar[int]

    @staticmethod
    @abstractmethod
    def array_handle(handle: str, index: int) -> str:
        """The handle of copy `index` of an array submitted as `handle`."""

    @staticmethod
    @abstractmethod
    def array_index(handle: str) -> int | None:
        """The copy's index if `handle` is one copy of an array, else None."""


@dataclass(frozen=True)
class SessionKeys:
    """What a dev allocation's per-connection sshd needs: its host key, and the one client key it accepts."""

    host_private_key: str
    authorized_key: str


class AllocationPhase(enum.StrEnum):
    PENDING = "PENDING"
    STARTING = "STARTING"  # running its setup
    READY = "READY"
    ENDED = "ENDED"
    FAILED = "FAILED"
    UNKNOWN = "UNKNOWN"


@dataclass(frozen=True)
class AllocationState:
    """A dev allocation's holder job as the infra sees it."""

    phase: AllocationPhase
    reason: str | None
    nodes: list[str]
    last_active: float | None
    time_left: str | None
    sshd: bool = False  # the head node has an sshd, so editors' remote-SSH can reach it
    ended_execs: dict[str, int] = field(default_factory=dict)  # exec id: exit status, for those over
    setup_output: str = ""  # when its setup failed: the last lines it printed (why, for the user)
    cpus_per_node: int | None = None  # what the infra gave it, once its holder has said (None: unknown)
    memory_mb_per_node: int | None = None
    expected_start: float | None = None  # while pending: when the infra expects it to start, if it says


@dataclass(frozen=True)
class SshRoute:
    """How plain `ssh NAME` reaches an allocation's head node: the login node's own ssh settings,
    the ProxyCommand argv that starts an sshd inside the allocation (None without sshd there), and
    the remote command of the fallback (a shell step)."""

    login_settings: dict[str, list[str]]
    proxy_argv: list[str] | None
    remote_command: str


EXIT_NOT_READY = 75  # `exec_in`'s exit status when the allocation is not ready


class HoldsAllocations(ABC):
    """The infra can hold nodes for a user to exec and ssh into (`corral launch -c NAME`)."""

    execs_on_fewer_nodes: ClassVar[bool] = True  # an exec may run on some of the nodes (exec_in's num_nodes)

    @abstractmethod
    async def hold(self, request: JobRequest, idle_seconds: int, session_keys: SessionKeys) -> SubmitResult:
        """Submit the holder job (idempotently, by the request's token); it runs `setup` once, then
        holds the nodes until released, its walltime ends, or it has been idle `idle_seconds` (0: never)."""

    @abstractmethod
    async def set_idle_limit(self, handle: str, run_dir: str, idle_seconds: int) -> None:
        """Give the live holder a new idle limit (0: never), its idle time counted from now
        (`corral autostop`)."""

    @abstractmethod
    async def allocation_states(self, held: list[tuple[str, str]]) -> dict[str, AllocationState]:
        """For (handle, run dir) pairs, each allocation's state by handle, in one round trip."""

    @abstractmethod
    async def exec_in(self, handle: str, run_dir: str, exec_id: str, num_nodes: int, accelerators_per_node: int,
                      envs: dict[str, str], run: str, on_output: OutputSink, setup: str = "",
                      gpus_claimed: int = 0) -> int:
        """Run `run` on the allocation's first `num_nodes` nodes (every node, unless the task asked for
        fewer); its exit status (EXIT_NOT_READY if not ready). With `setup`, that first on every node
        of the allocation, in the same exec (its output, its cancel), and `run` only if it succeeded.
        `accelerators_per_node`: the GPUs the allocation holds per node; `gpus_claimed` > 0: the exec
        takes that many of them for itself, waiting while other execs hold them, and sees only those
        (a backend that cannot keep them apart shows it all of them)."""

    @abstractmethod
    async def exec_output(self, handle: str, run_dir: str, exec_id: str, follow: bool, on_output: OutputSink,
                          tail: int = 0) -> None:
        """What an exec showed (the head node's, for several), kept in the allocation until it is
        released; with `follow`, until the exec ends. `tail` > 0: from its last `tail` lines."""

    @abstractmethod
    async def cancel_exec(self, handle: str, run_dir: str, exec_id: str) -> None:
        """End a running exec, leaving the allocation held."""

    @abstractmethod
    async def release(self, handle: str | None, run_dir: str) -> None:
        """End the holder job and remove its files."""

    async def deliver_uploads(self, handle: str) -> None:
        """Send what `upload` kept back for the live allocation `handle`'s run directory to its nodes
        (an infra that picks a task's machines when it starts keeps such files until then); by
        default nothing is kept back."""

    @abstractmethod
    def shell_argv(self, handle: str, head_node: str, run_dir: str, command: str | None) -> list[str]:
        """The local argv of `corral ssh`: a shell on the head node, interactive, or running `command`;
        in the allocation's image where it has one."""

    @abstractmethod
    def login_shell_command(self, handle: str, head_node: str, run_dir: str) -> str:
        """What the allocation's owner runs on the login node, in their own ssh session there, for a shell
        on the head node (the dashboard's copyable command for users who log in themselves)."""

    @abstractmethod
    async def ssh_route(self, name: str, handle: str, head_node: str, run_dir: str, sshd: bool) -> SshRoute:
        """What the ssh alias of the allocation needs."""


class FollowsSetup(ABC):
    """The infra can show a dev allocation's `setup` output as it runs (`corral launch -c NAME`)."""

    @abstractmethod
    async def setup_output(self, handle: str, run_dir: str, on_output: OutputSink) -> None:
        """The holder's output from its start, as it comes, until its setup is over (ready or failed)
        or the holder has ended."""


def holder(infra: Infra) -> HoldsAllocations:
    """`infra` as one that holds dev allocations, or a clear error naming it."""
    if not isinstance(infra, HoldsAllocations):
        raise CorralError(f"{infra.name} cannot hold dev allocations")
    return infra


class RunsJobScripts(ABC):
    """The infra runs a user's own batch script (`corral sbatch`: the request's `scheduler_options`
    carry it), rewriting only what is site-specific."""

    @abstractmethod
    def script_for(self, request: JobRequest) -> tuple[str, str]:
        """The script as this infra would receive it, and the submit command line (pure: for dry runs)."""


class ReleasesHeld(ABC):
    """The infra can queue a job held (it keeps its place, it does not start) and release it later:
    a managed job's move is submitted held, and released once the old attempt is known not to run."""

    @abstractmethod
    async def release_held(self, handles: list[str]) -> None:
        """Let these held jobs start."""


@dataclass(frozen=True)
class EndedRun:
    """An ended attempt's files: its run directory, and its handle (None if never accepted), which
    names where they are on an infra of several machines."""

    run_dir: str
    handle: str | None


class RemovesRunFiles(ABC):
    """The infra can remove what an ended attempt no longer needs from its run directory (run_files.py)."""

    @abstractmethod
    async def remove_env_files(self, ended: list[EndedRun]) -> None:
        """Remove each one's env.sh (the job's env values, secrets included), in one round trip per
        machine; one that is gone already is no error. Its log and the rest stay."""

    @abstractmethod
    async def remove_run_dirs(self, ended: list[EndedRun]) -> None:
        """Remove each one's whole run directory (log and workdir copy included), as remove_env_files."""


class HostsJobGroups(ABC):
    """The infra runs a job group's tasks (managed.md): each node of each task leaves its address in
    CORRAL_JOBGROUP_HOSTS, a folder of files by which the group's tasks find each other, and the infra
    can remove a group's once every task of it has ended (run_files.py). An infra without this ability
    is left out of a job group's placement, saying so."""

    def job_group_refusal(self) -> str | None:
        """Why it cannot run a job group's tasks as it is now (None: it can)."""
        return None

    @abstractmethod
    async def remove_group_files(self, group_ids: list[str]) -> None:
        """Remove each group's files, in one round trip; one that is gone already is no error."""


class PrunesWorkdirCaches(ABC):
    """The infra keeps a cache of each workdir sent to it, which only speeds later launches from the
    same folder up, and can remove those not used for a while (run_files.py)."""

    @abstractmethod
    async def prune_workdir_caches(self, keep_days: float) -> int:
        """Remove the caches last used more than `keep_days` days ago, never one a sync is using, in one
        round trip; how many went."""


class ReportsSetupFailure(ABC):
    """The infra can tell whether a failed attempt failed in the task's `setup` (not worth retrying)."""

    @abstractmethod
    async def setup_failed(self, run_dir: str) -> bool:
        """True if the attempt whose files are in `run_dir` failed in setup; False when unsure."""


class CopiesCheckpoints(ABC):
    """The infra can copy a directory out (a managed job's checkpoints, to another infra's `upload`)."""

    @abstractmethod
    async def fetch_dir(self, remote_dir: str, local_dir: Any) -> bool:
        """Copy `remote_dir` (relative to the user's home) into `local_dir`; False if it does not exist."""

    async def send_dir(self, remote_dir: str, target: Infra, destination: str) -> bool | None:
        """Copy `remote_dir` straight into `destination` on `target`, never through this machine's disk,
        where the two can (a TakesFolderStreams target); False if it does not exist; None where they
        cannot (then fetch_dir and the target's upload carry it). A failure raises the error of the side
        that failed, naming its cluster."""
        return None


class TakesFolderStreams(ABC):
    """The infra unpacks a folder sent to it as a tar stream over ssh (CopiesCheckpoints.send_dir)."""

    @abstractmethod
    def stream_target(self) -> tuple[Any, str]:
        """The ssh transport and host a tar stream for it goes to."""
