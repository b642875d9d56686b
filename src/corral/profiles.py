"""Cluster profiles: what differs between clusters for the same task, kept out of the task.

A profile lives in the server's `config.yaml` (under CORRAL_HOME: a user's own, or a team server's),
per cluster and, where it matters, per partition:

    clusters:
      alpine:
        account: research            # sbatch defaults: account, qos, constraint, reservation, time,
        qos: normal                  #   sbatch_args (as the task's `slurm:` block names them)
        env: {NCCL_IB_DISABLE: "1"}  # environment the task's own envs override
        setup_prefix: module load cuda/12.1   # shell lines before the task's setup and before its run
        paths: {CORRAL_SCRATCH: /scratch/$USER}   # names for this cluster's directories
        avoid_partitions: [debug]    # never placed there unless the task names the partition
        partitions:
          gpu: {qos: gpu-high, time: "2-00:00:00"}

The task wins over the profile, field by field: its `slurm:` options over the profile's sbatch
defaults, its `envs` and `secrets` over `env` and `paths`, its pinned partition over
`avoid_partitions`. A partition's settings win over its cluster's. Placement reads profiles from
memory: a profile adds no SSH round trip. Pure, apart from `Profiles.load` (one small YAML file).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from typing import Any

from pydantic import ConfigDict, Field, ValidationError, field_validator

from corral.errors import ConfigError
from corral.infra.base import ClusterSnapshot, shared_filesystem
from corral.placement import Plan
from corral.task import (
    RESERVED_ENV_PREFIX,
    SAFE_PATH,
    SAFE_PATH_CHARS,
    SlurmOptions,
    Task,
    check_line,
    expandable,
    format_validation_error,
)

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z", re.ASCII)
# Variables Corral itself sets in every job: a profile's path may not take their names.
CORRAL_SETS = frozenset({"CORRAL_ATTEMPT", "CORRAL_CHECKPOINT_DIR", "CORRAL_CLUSTER", "CORRAL_JOB_RANK",
                         "CORRAL_JOBGROUP_HOSTS", "CORRAL_JOBGROUP_NAME",
                         "CORRAL_JOBGROUP_TASK", "CORRAL_NODE_IPS", "CORRAL_NODE_RANK", "CORRAL_NUM_GPUS_PER_NODE", "CORRAL_NUM_JOBS",
                         "CORRAL_NUM_NODES", "CORRAL_PIPELINE_ID", "CORRAL_PIPELINE_NAME", "CORRAL_PIPELINE_TASK",
                         "CORRAL_RUN_DIR", "CORRAL_TASK_ID"})
SCHEDULER_FIELDS = ("account", "qos", "constraint", "reservation", "time")


class PartitionProfile(SlurmOptions):
    """What a job on one cluster (or one of its partitions) runs with, unless the task says otherwise."""

    model_config = ConfigDict(extra="forbid")

    script: None = Field(None, exclude=True, description="Not in a profile: a job script belongs to a task.")
    env: dict[str, str] = Field(default_factory=dict, description="Environment; the task's envs win.")
    setup_prefix: str | None = Field(None, description="Shell lines run before the task's setup and before its "
                                                       "run, in the same shell (e.g. `module load cuda/12.4`).")
    paths: dict[str, str] = Field(default_factory=dict,
                                  description="Names for this cluster's directories, e.g. CORRAL_SCRATCH: "
                                              "/scratch/$USER ($USER, $HOME and ~ are expanded on the node).")

    @field_validator("env")
    @classmethod
    def _env(cls, value: dict[str, str]) -> dict[str, str]:
        for key, item in value.items():
            if not _ENV_NAME.match(key) or key.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"env {key!r}: a variable name, not starting with {RESERVED_ENV_PREFIX}")
            if not isinstance(item, str) or "\x00" in item:
                raise ValueError(f"env {key}: a string without NUL characters (quote numbers: \"1\")")
        return value

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: dict[str, str]) -> dict[str, str]:
        for key, path in value.items():
            if not _ENV_NAME.match(key) or key in CORRAL_SETS:
                raise ValueError(f"paths {key!r}: a variable name that Corral does not set itself")
            if not isinstance(path, str) or not SAFE_PATH.match(path):
                raise ValueError(f"paths {key}: {path!r}: {SAFE_PATH_CHARS} (no spaces, quotes or other $)")
        return value

    @field_validator("setup_prefix")
    @classmethod
    def _prefix(cls, value: str | None) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError("setup_prefix cannot hold a NUL character")
        return value


class ClusterProfile(PartitionProfile):
    """A cluster's profile: its partitions' own settings, and the partitions placement avoids."""

    submit_as: str | None = Field(None, description="A team server's way of acting as each member (accounts.py).")
    avoid_partitions: list[str] = Field(default_factory=list, description="Never placed there, unless the task "
                                                                          "names the partition.")
    partitions: dict[str, PartitionProfile] = Field(default_factory=dict)
    rpc_budget: dict[str, int] | None = Field(None, description="The most Slurm commands a minute Corral sends "
                                                                "this cluster (budget.py; checked by config.py).")

    @field_validator("avoid_partitions")
    @classmethod
    def _names(cls, value: list[str]) -> list[str]:
        for name in value:
            check_line(name, "avoid_partitions entry", max_length=256)
        return value


@dataclass(frozen=True)
class RunSettings:
    """What one candidate (cluster, partition) runs a task with: the profile and the task merged."""

    scheduler_options: Mapping[str, Any] = field(default_factory=dict)  # sbatch options, the task's `slurm:` shape
    env: Mapping[str, str] = field(default_factory=dict)  # under the task's own envs
    paths: Mapping[str, str] = field(default_factory=dict)  # exported first, unless the task sets the name
    setup_prefix: str | None = None

    def prefix(self) -> str:
        """Shell lines for the top of setup and run: the paths (kept when the task's env sets the name),
        then the profile's setup_prefix."""
        lines = [f'export {name}="${{{name}-{expandable(path)}}}"' for name, path in self.paths.items()]
        if self.setup_prefix:
            lines.append(self.setup_prefix.rstrip("\n"))
        return "\n".join(lines)

    def to_json(self) -> dict[str, Any]:
        return {"slurm": dict(self.scheduler_options), "env": sorted(self.env), "paths": dict(self.paths),
                "setup_prefix": self.setup_prefix}

    def describe(self) -> str:
        """One line for the plan: the sbatch options, env names, paths and prefix."""
        parts = [f"--{k.replace('_', '-')}={v}" for k, v in self.scheduler_options.items() if k in SCHEDULER_FIELDS]
        parts += list(self.scheduler_options.get("sbatch_args", []))
        if self.env:
            parts.append("env " + ",".join(sorted(self.env)))
        parts += [f"{name}={path}" for name, path in self.paths.items()]
        if self.setup_prefix:
            parts.append("then: " + "; ".join(line.strip() for line in self.setup_prefix.splitlines() if line.strip()))
        return " ".join(parts)


def with_prefix(prefix: str, commands: str | None) -> str | None:
    """The task's setup or run with the profile's lines before it (nothing to run stays nothing)."""
    if not commands or not prefix:
        return commands
    return f"{prefix}\n{commands}"


@dataclass(frozen=True)
class Profiles:
    clusters: Mapping[str, ClusterProfile] = field(default_factory=dict)

    @classmethod
    def load(cls, known: list[str] | None = None) -> Profiles:
        """The profiles of the server's config.yaml (none without one); ConfigError naming the field, or
        a cluster not among `known` (the cluster file's)."""
        from corral.config import load_user_settings, settings_path

        raw = load_user_settings().get("clusters") or {}
        assert isinstance(raw, dict)
        clusters: dict[str, ClusterProfile] = {}
        for name, options in raw.items():
            if known is not None and name not in known:
                raise ConfigError(f"clusters.{name}: no such cluster in the cluster file (clusters: "
                                  f"{', '.join(known)})", settings_path())
            try:
                clusters[str(name)] = ClusterProfile.model_validate(options or {})
            except ValidationError as exc:
                detail = format_validation_error(exc, f"clusters.{name}").replace(": invalid task: ", ": ", 1)
                raise ConfigError(detail, settings_path()) from None
        return cls(clusters)

    def avoided(self, cluster: str, partition: str, task: Task) -> bool:
        """Does the profile keep the task off this partition? Not when the task names it."""
        profile = self.clusters.get(cluster)
        if profile is None or partition not in profile.avoid_partitions:
            return False
        pinned = {option.infra.partition for option in _options(task)}
        return partition not in pinned

    def settings(self, cluster: str, partition: str, task: Task) -> RunSettings:
        """The profile for (cluster, partition) under the task: the task's `slurm:` options win over the
        profile's, a partition's over its cluster's; `sbatch_args` add up (profile's first)."""
        layers = [p for p in self._layers(cluster, partition)]
        options: dict[str, Any] = {}
        env: dict[str, str] = {}
        paths: dict[str, str] = {}
        prefix: list[str] = []
        args: list[str] = []
        for layer in layers:
            options.update({k: getattr(layer, k) for k in SCHEDULER_FIELDS if getattr(layer, k) is not None})
            env.update(layer.env)
            paths.update(layer.paths)
            args += layer.sbatch_args
            if layer.setup_prefix:
                prefix.append(layer.setup_prefix.rstrip("\n"))
        mine = task.slurm.model_dump(exclude_none=True)
        options.update({k: v for k, v in mine.items() if k in SCHEDULER_FIELDS})
        args += mine.get("sbatch_args", [])
        if args:
            options["sbatch_args"] = args
        own_env = set(task.envs) | set(task.secrets)
        return RunSettings(options, {k: v for k, v in env.items() if k not in own_env},
                           {k: v for k, v in paths.items() if k not in own_env}, "\n".join(prefix) or None)

    def _layers(self, cluster: str, partition: str) -> list[PartitionProfile]:
        profile = self.clusters.get(cluster)
        if profile is None:
            return []
        return [profile] + ([profile.partitions[partition]] if partition in profile.partitions else [])

    def named(self, cluster: str) -> dict[str, set[str]]:
        """The accounts, QOS and partitions this cluster's profile names (for `corral check`)."""
        profile = self.clusters.get(cluster)
        if profile is None:
            return {"account": set(), "qos": set(), "partition": set()}
        layers = [profile, *profile.partitions.values()]
        return {"account": {p.account for p in layers if p.account},
                "qos": {q for p in layers if p.qos for q in p.qos.split(",")},
                "partition": set(profile.partitions) | set(profile.avoid_partitions)}


def _options(task: Task) -> list[Any]:
    from corral.task import resource_options

    return resource_options(task.resources)


def apply_profiles(plan: Plan, task: Task, profiles: Profiles) -> Plan:
    """Each candidate with what it would run with; partitions a profile avoids made infeasible, saying so."""
    plan.candidates = [
        c.refused("avoided by the cluster's profile (avoid_partitions)")
        if c.feasible and profiles.avoided(c.cluster, c.partition, task)
        else replace(c, runs_with=profiles.settings(c.cluster, c.partition, task))
        for c in plan.candidates]
    return plan


def profile_warnings(cluster: str, snapshot: ClusterSnapshot, profiles: Profiles) -> list[str]:
    """What the cluster's profile names that the cluster does not know: a partition it lacks, an account
    or QOS the user has no association with (when the probe learnt them; said when it could not); and a
    path of its on a filesystem the compute nodes do not share."""
    named = profiles.named(cluster)
    out = []
    for name, path in named_paths(profiles, cluster).items():
        kind = snapshot.path_filesystems.get(path)
        if kind and shared_filesystem(kind) is False:
            out.append(f"the profile's {name} ({path}) is on {kind}, which the compute nodes may not share: "
                       "a multi-node job's nodes would not see each other's files there")
    partitions = sorted(p.name for p in snapshot.partitions)
    for name in sorted(named["partition"] - set(partitions)):
        out.append(f"the profile names partition {name!r}, which {cluster} does not have "
                   f"(partitions: {', '.join(partitions)})")
    for kind, known in (("account", snapshot.accounts), ("qos", snapshot.qos)):
        wanted = named[kind]
        if not wanted:
            continue
        label = "QOS" if kind == "qos" else kind
        if known is None:
            out.append(f"could not check the profile's {label} {', '.join(sorted(wanted))}: {cluster} did not "
                       "list your associations (no accounting there, or sacctmgr failed)")
            continue
        for name in sorted(wanted - set(known)):
            out.append(f"the profile names {label} {name!r}, which your user has no association with on {cluster} "
                       f"(yours: {', '.join(known) or 'none'})")
    return out


def named_paths(profiles: Profiles, cluster: str) -> dict[str, str]:
    """The cluster's profile's `paths` (its partitions' too): name -> path."""
    profile = profiles.clusters.get(cluster)
    if profile is None:
        return {}
    found = dict(profile.paths)
    for partition in profile.partitions.values():
        found.update(partition.paths)
    return found
