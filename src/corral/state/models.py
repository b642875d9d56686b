"""Tables. A job has a stable Corral id and one or more attempts; an attempt is one submission to an
infra, known by the infra's opaque handle (on Slurm, a job id such as "123" or an array copy's "123_4").
The schema's history is in `migrations/`: change a table here and add a revision there."""

from __future__ import annotations

import enum

from sqlalchemy import Boolean, Float, ForeignKey, Integer, String, Text, false, text
from sqlalchemy.orm import DeclarativeBase, Mapped, mapped_column


class Base(DeclarativeBase):
    pass


class JobRow(Base):
    __tablename__ = "jobs"

    id: Mapped[str] = mapped_column(String(32), primary_key=True)
    name: Mapped[str] = mapped_column(String(256))
    task_json: Mapped[str] = mapped_column(Text)
    created_at: Mapped[float] = mapped_column(Float, index=True)
    job_rank: Mapped[int] = mapped_column(Integer, default=0)
    num_jobs: Mapped[int] = mapped_column(Integer, default=1)
    sweep_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)  # the first job's id
    submitter: Mapped[str | None] = mapped_column(String(160), nullable=True)  # liveness.process_tag()
    allocation: Mapped[str | None] = mapped_column(String(128), nullable=True, index=True)  # exec jobs
    secrets_sealed: Mapped[str | None] = mapped_column(Text, nullable=True)  # state/sealed.py; never clear text
    # The user it belongs to (controller/auth.py); "" for jobs made before the server had users.
    owner: Mapped[str] = mapped_column(String(128), default="", server_default=text("''"), index=True)


class AttemptRow(Base):
    __tablename__ = "attempts"

    token: Mapped[str] = mapped_column(String(64), primary_key=True)  # put on the job by the infra (Slurm: its name)
    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), index=True)
    number: Mapped[int] = mapped_column(Integer, default=1)
    cluster: Mapped[str] = mapped_column(String(256))
    partition: Mapped[str] = mapped_column(String(256))
    # the infra's (a Slurm job id); None until accepted; indexed: `corral cancel 4711` finds its job by it
    handle: Mapped[str | None] = mapped_column(String(64), nullable=True, index=True)
    state: Mapped[str] = mapped_column(String(32), index=True)
    created_at: Mapped[float] = mapped_column(Float, default=0.0)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    run_dir: Mapped[str] = mapped_column(Text)  # on the cluster, relative to the user's home
    log_path: Mapped[str] = mapped_column(Text)  # on the cluster, relative to the user's home
    # A script's --error file, where it is not the log: its stderr (`corral logs --stderr`); else NULL.
    error_path: Mapped[str | None] = mapped_column(Text, nullable=True)
    submitted_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    started_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    ended_at: Mapped[float | None] = mapped_column(Float, nullable=True)
    exit_code: Mapped[int | None] = mapped_column(Integer, nullable=True)
    expected_start: Mapped[float | None] = mapped_column(Float, nullable=True)  # while pending: Slurm's estimate
    failure: Mapped[str | None] = mapped_column(String(16), nullable=True)  # infra.base.FailureClass, once it failed
    submitter: Mapped[str | None] = mapped_column(String(160), nullable=True)  # liveness.process_tag()
    held: Mapped[bool | None] = mapped_column(Boolean, nullable=True)  # a move's attempt, until released
    # What Corral has removed of the run directory once the attempt ended (RunDirState); NULL: nothing.
    run_dir_state: Mapped[str | None] = mapped_column(String(16), nullable=True, index=True)


class RunDirState(enum.StrEnum):
    """What Corral has removed of an ended attempt's run directory on its cluster (run_files.py)."""

    ENV_REMOVED = "env-removed"  # its env.sh, which holds the job's env values, secrets included
    REMOVED = "removed"  # the whole directory, log included (`run_dirs: {keep_days: N}` in config.yaml)


class AllocationRow(Base):
    """A dev allocation (`corral launch -c NAME`): a named holder job and its jobs run by exec."""

    __tablename__ = "allocations"

    # Names are per user: two people may each hold an allocation called "dev".
    owner: Mapped[str] = mapped_column(String(128), primary_key=True, default="", server_default=text("''"))
    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    token: Mapped[str] = mapped_column(String(64))
    cluster: Mapped[str] = mapped_column(String(256))
    partition: Mapped[str] = mapped_column(String(256))
    handle: Mapped[str | None] = mapped_column(String(64), nullable=True)  # the holder job's
    num_nodes: Mapped[int] = mapped_column(Integer)
    accelerator: Mapped[str | None] = mapped_column(String(256), nullable=True)  # the infra's name for its type
    gpus_per_node: Mapped[int] = mapped_column(Integer, default=0)
    resources: Mapped[str] = mapped_column(Text)  # what was asked for, to compare with a relaunch
    # What the infra gave it per node, as its holder read it once started (None until then, or unknown).
    held_cpus: Mapped[int | None] = mapped_column(Integer, nullable=True)
    held_memory_mb: Mapped[int | None] = mapped_column(Integer, nullable=True)
    run_dir: Mapped[str] = mapped_column(Text)
    idle_seconds: Mapped[int] = mapped_column(Integer, default=0)
    created_at: Mapped[float] = mapped_column(Float)


class ManagedState(enum.StrEnum):
    """A managed job's own state, across its attempts (an attempt's state is infra.base.JobState)."""

    PENDING = "PENDING"
    STARTING = "STARTING"
    RUNNING = "RUNNING"
    RECOVERING = "RECOVERING"  # its last attempt failed for a reason the controller recovers from
    CANCELLING = "CANCELLING"  # cancel requested; the controller cancels its attempts on its next tick
    SUCCEEDED = "SUCCEEDED"
    FAILED = "FAILED"
    FAILED_SETUP = "FAILED_SETUP"  # its setup failed: not retried, it would fail again
    CANCELLED = "CANCELLED"


MANAGED_TERMINAL_STATES = frozenset({ManagedState.SUCCEEDED, ManagedState.FAILED, ManagedState.FAILED_SETUP,
                                     ManagedState.CANCELLED})


class ManagedJobRow(Base):
    """A managed job's own state, driven by the controller across attempts."""

    __tablename__ = "managed_jobs"

    job_id: Mapped[str] = mapped_column(ForeignKey("jobs.id"), primary_key=True)
    state: Mapped[str] = mapped_column(String(32), index=True)
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)
    restarts_on_errors: Mapped[int] = mapped_column(Integer, default=0)
    recoveries: Mapped[int] = mapped_column(Integer, default=0)
    moves: Mapped[int] = mapped_column(Integer, default=0)
    last_move_at: Mapped[float] = mapped_column(Float, default=0.0)
    cancel_requested: Mapped[bool] = mapped_column(Boolean, default=False)
    updated_at: Mapped[float] = mapped_column(Float, default=0.0)
    # A managed pipeline's task (`corral jobs launch` of a file of several tasks): the first task's job
    # id, the pipeline's name, and this task's place in it (0, 1, …): it starts once the one before has
    # succeeded. NULL for a job that is not part of a pipeline.
    pipeline_id: Mapped[str | None] = mapped_column(String(32), nullable=True, index=True)
    pipeline_name: Mapped[str | None] = mapped_column(String(256), nullable=True)
    pipeline_stage: Mapped[int | None] = mapped_column(Integer, nullable=True)
    # A job group's task (`execution: parallel`): its tasks run side by side on one cluster, none waits
    # for another. An auxiliary task has a termination delay: it is stopped that many seconds after the
    # group's primary tasks (those with none) have all ended.
    pipeline_parallel: Mapped[bool] = mapped_column(Boolean, default=False, server_default=false())
    termination_delay: Mapped[float | None] = mapped_column(Float, nullable=True)
    # The round of a job group's placement this task runs in: the tasks placed together on one cluster
    # share it, and name their CORRAL_JOBGROUP_HOSTS folder by it (a group that moves starts afresh).
    group_round: Mapped[str | None] = mapped_column(String(16), nullable=True)
    # Whether the server has removed the group's host folders from the clusters its tasks ran on, once
    # every task ended (run_files.py): False until then, True after; NULL for any other managed job.
    group_files_removed: Mapped[bool | None] = mapped_column(Boolean, nullable=True, index=True)

    @property
    def auxiliary(self) -> bool:
        """Is this a job group's auxiliary task (one its group stops after the primary tasks end)?"""
        return self.termination_delay is not None

    @property
    def group_id(self) -> str | None:
        """The id of the job group this is a task of; None for any other managed job."""
        return self.pipeline_id if self.pipeline_parallel else None


class JobEventRow(Base):
    __tablename__ = "job_events"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    job_id: Mapped[str] = mapped_column(String(32), index=True)
    at: Mapped[float] = mapped_column(Float)
    state: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str | None] = mapped_column(Text, nullable=True)


class LeaseRow(Base):
    """A lease in the store, renewed by its holder every tick: `controller` (the chores one replica does:
    usage samples, settling interrupted launches), `cluster:<name>` (who refreshes and drives that
    cluster's jobs) and `replica:<holder>` (a live replica's heartbeat); see controller/shards.py."""

    __tablename__ = "leases"

    name: Mapped[str] = mapped_column(String(64), primary_key=True)
    holder: Mapped[str] = mapped_column(String(128))
    expires_at: Mapped[float] = mapped_column(Float)
    note: Mapped[str | None] = mapped_column(String(256), nullable=True, default=None)  # a replica's cluster list


class ClusterHealthRow(Base):
    __tablename__ = "cluster_health"

    cluster: Mapped[str] = mapped_column(String(256), primary_key=True)
    failures: Mapped[int] = mapped_column(Integer, default=0)
    unhealthy_until: Mapped[float] = mapped_column(Float, default=0.0)
    unreachable_since: Mapped[float | None] = mapped_column(Float, nullable=True)


class UserRow(Base):
    """A person or a service account of a team server, and the hash of its API token (never the token)."""

    __tablename__ = "users"

    name: Mapped[str] = mapped_column(String(128), primary_key=True)
    role: Mapped[str] = mapped_column(String(16))  # controller.auth.Role
    token_hash: Mapped[str] = mapped_column(String(64), unique=True)  # SHA-256 of the token, hex
    unix_users: Mapped[str] = mapped_column(Text, default="{}")  # JSON: cluster -> Unix account there
    service: Mapped[bool] = mapped_column(Boolean, default=False)  # a service account (CI, bots)
    created_at: Mapped[float] = mapped_column(Float)
    expires_at: Mapped[float | None] = mapped_column(Float, nullable=True)  # None: never
    # The key the server reaches the user's cluster accounts with (accounts.py): the public half in
    # clear (the user authorizes it), the private half sealed (state/sealed.py).
    ssh_public_key: Mapped[str | None] = mapped_column(Text, nullable=True)
    ssh_key_sealed: Mapped[str | None] = mapped_column(Text, nullable=True)


class WebSessionRow(Base):
    """The dashboard's logins: a one-time code from `corral dashboard` (kind "code", a minute), swapped
    for a browser session (kind "session", a cookie). Only SHA-256 hashes of either are kept."""

    __tablename__ = "web_sessions"

    id_hash: Mapped[str] = mapped_column(String(64), primary_key=True)
    kind: Mapped[str] = mapped_column(String(8))  # "code" or "session"
    owner: Mapped[str] = mapped_column(String(128))  # the user it logs in ("" for the server's own account)
    expires_at: Mapped[float] = mapped_column(Float, index=True)


class GpuSampleRow(Base):
    """GPU use over time (usage.py): one row per cluster, partition and GPU type per sample."""

    __tablename__ = "gpu_samples"

    id: Mapped[int] = mapped_column(Integer, primary_key=True, autoincrement=True)
    at: Mapped[float] = mapped_column(Float, index=True)
    cluster: Mapped[str] = mapped_column(String(256))
    partition: Mapped[str] = mapped_column(String(256))
    gpu: Mapped[str] = mapped_column(String(256))
    free: Mapped[int] = mapped_column(Integer)
    total: Mapped[int] = mapped_column(Integer)
    pending: Mapped[int] = mapped_column(Integer)
