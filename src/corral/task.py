"""The task YAML: pydantic models that are also the docs and the JSON Schema (`corral schema`).

Fields are named as SkyPilot names them, so its users' task files run unchanged: `name`, `workdir`,
`num_nodes`, `envs`, `file_mounts` (remote path: local path), `setup`, `run`, and `resources` with
`accelerators`, `cpus`, `memory`, `infra`, `image_id`, `any_of` and `ordered`. Slurm options that have
no portable meaning go under `slurm:`.
"""

from __future__ import annotations

import difflib
import enum
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    ValidationError,
    ValidationInfo,
    field_validator,
    model_validator,
)

from corral.buckets import check_source
from corral.errors import CorralError, TaskError
from corral.infra.selector import EXPECTED as INFRA_FORMS
from corral.infra.selector import InfraSelector, parse_any_infra, supported
from corral.taskfile import (
    MAX_TASK_FILE_BYTES,
    MAX_YAML_DEPTH,
    MAX_YAML_NODES,
    parse_yaml,
    read_task_text,
)

__all__ = ["MAX_TASK_FILE_BYTES", "MAX_YAML_DEPTH", "MAX_YAML_NODES", "TaskError", "parse_yaml"]

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\Z", re.ASCII)
# Values that land on an `#SBATCH` line: one word of Slurm's own syntax, never a line end or a space
# (sbatch splits `#SBATCH` lines on whitespace, and a newline ends the directives).
_SLURM_WORD = re.compile(r"^[A-Za-z0-9_.,:+@%=\-]{1,256}\Z", re.ASCII)
_SLURM_CONSTRAINT = re.compile(r"^[A-Za-z0-9_.,:+@%=\-&|\[\]*()!]{1,1024}\Z", re.ASCII)
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_WORD_CHARS = "letters, digits and _ . , : + @ % = -"
_SLURM_SYNTAX = {"account": (_SLURM_WORD, _WORD_CHARS), "qos": (_SLURM_WORD, _WORD_CHARS),
                 "reservation": (_SLURM_WORD, _WORD_CHARS),
                 "constraint": (_SLURM_CONSTRAINT, "node features joined with & | , * [ ] ( ) !")}
# sbatch options Corral sets itself (job name = token, log file, array, working directory) or that
# take a job out of Corral's hands (another cluster, a wrapped command).
RESERVED_SBATCH_OPTIONS = {
    "--job-name": "-J", "--output": "-o", "--error": "-e", "--array": "-a", "--open-mode": None,
    "--chdir": "-D", "--wrap": None, "--parsable": None, "--test-only": None, "--clusters": "-M",
}
RESERVED_ENV_PREFIX = "CORRAL_"  # Corral's own variables (CORRAL_TASK_ID, CORRAL_NODE_RANK, …)
MAX_RESOURCE_OPTIONS = 64  # alternatives after expanding any_of/ordered and accelerator lists
MAX_NAME_LENGTH = 200
_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE)\Z", re.I | re.ASCII)
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(\+?)\s*$")
# A path on a cluster that Corral writes into a script: $USER, ${USER}, $HOME, ${HOME} and a leading ~
# expand there; everything else is taken literally from a set that needs no quoting inside "…".
SAFE_PATH = re.compile(r"^(~|\$USER|\$\{USER\}|\$HOME|\$\{HOME\}|[A-Za-z0-9_./@+,:=\-])+\Z", re.ASCII)
SAFE_PATH_CHARS = "letters, digits and _ . / @ + , : = -, with $USER, $HOME or a leading ~"


def expandable(path: str) -> str:
    """A SAFE_PATH for the inside of double quotes: only $USER/$HOME expand; a leading ~ becomes $HOME."""
    return "$HOME" + path[1:] if path.startswith("~") else path
_IMAGE = re.compile(r"^(docker:)?[a-z0-9][a-z0-9._\-/:@]*\Z", re.I | re.ASCII)


@dataclass(frozen=True)
class AcceleratorRequest:
    name: str
    count: int

    def __str__(self) -> str:
        return f"{self.name}:{self.count}"


@dataclass(frozen=True)
class Amount:
    """`4` means exactly 4; `4+` means at least 4."""

    value: float
    at_least: bool

    def __str__(self) -> str:
        number = int(self.value) if self.value == int(self.value) else self.value
        return f"{number}{'+' if self.at_least else ''}"


def parse_accelerator(text: str) -> AcceleratorRequest:
    name, sep, count = text.strip().partition(":")
    if not name or (sep and not count.strip().isdigit()):
        raise ValueError(f"invalid accelerator {text!r}: expected NAME or NAME:COUNT, e.g. H100:8")
    number = int(count) if sep else 1
    if number < 1:
        raise ValueError(f"invalid accelerator {text!r}: the count must be at least 1")
    return AcceleratorRequest(name.strip(), number)


def parse_amount(value: Any, what: str) -> Amount:
    match = _AMOUNT.match(str(value))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"invalid {what} {value!r}: expected a positive number, optionally followed by + (e.g. 8 or 8+)")
    return Amount(float(match.group(1)), bool(match.group(2)))


_MEMORY = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(\+?)\s*([KMGTP]B?)?\s*(\+?)\s*$", re.I | re.ASCII)
_GB_PER_UNIT = {"K": 1 / 1024 ** 2, "M": 1 / 1024, "G": 1.0, "T": 1024.0, "P": 1024.0 ** 2}


def parse_memory(value: Any) -> Amount:
    """Memory in GB, as SkyPilot writes it: `32`, `32+`, `64GB`, `1024MB`, `1TB+` (units are powers of
    1024, case-insensitive; GB when none)."""
    match = _MEMORY.match(str(value))
    if not match or float(match.group(1)) <= 0 or (match.group(2) and match.group(4)):
        raise ValueError(f"invalid memory {value!r}: expected GB as a positive number, optionally with a unit "
                         "(KB, MB, GB, TB, PB) and + for at least (e.g. 64, 64+, 512MB, 1TB+)")
    unit = (match.group(3) or "G")[0].upper()
    return Amount(float(match.group(1)) * _GB_PER_UNIT[unit], bool(match.group(2) or match.group(4)))


def check_sbatch_arg(arg: str) -> str:
    """One pass-through sbatch option: an option, one word, and not one Corral sets itself."""
    if not arg.startswith("-") or len(arg) < 2:
        raise ValueError(f"sbatch option {arg!r} must start with '-' (one option per item, e.g. --exclusive)")
    if _CONTROL.search(arg) or any(c.isspace() for c in arg) or any(c in arg for c in "'\"\\"):
        raise ValueError(f"sbatch option {arg!r} must be one word: no spaces, quotes or line breaks "
                         "(one option per item, e.g. --comment=nightly)")
    name = arg.split("=", 1)[0]
    for long, short in RESERVED_SBATCH_OPTIONS.items():
        if (len(name) > 2 and len(long) >= len(name) and long.startswith(name) and name.startswith("--")) or (
                short and not arg.startswith("--") and arg.startswith(short)):
            raise ValueError(f"sbatch option {arg!r} cannot be passed through: Corral sets {long} itself")
    return arg


def check_line(value: str, what: str, *, max_length: int = 4096) -> str:
    """A value that must stay one line of text (names, paths)."""
    if not value.strip() or _CONTROL.search(value) or len(value) > max_length:
        raise ValueError(f"{what} {value!r} must be one non-empty line of at most {max_length} characters, "
                         "without control characters")
    return value


_SCRIPT_NAME = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.+\-]{0,127}\Z", re.ASCII)


class JobScript(BaseModel):
    """An sbatch job script, run as it is (`corral sbatch`, `corral launch script.sh`): its `#SBATCH`
    directives give the resources; per cluster, Corral rewrites only the site-specific ones."""

    model_config = ConfigDict(extra="forbid")

    text: str = Field(max_length=MAX_TASK_FILE_BYTES, description="The script, byte for byte.")
    file_name: str = Field("job.sh", description="Its file name on the cluster (sbatch's default job name).")
    options: list[str] = Field(default_factory=list, max_length=1000,
                               description="sbatch options from the command line, as words; they win over the "
                                           "script's #SBATCH lines.")
    args: list[str] = Field(default_factory=list, max_length=1000, description="The script's own arguments.")
    dependencies: dict[str, str] = Field(
        default_factory=dict, max_length=1000,
        description="Set by the server: the Corral jobs its --dependency names (afterok:c-…), as the Slurm job ids "
                    "they had on the cluster the script is pinned to.")

    @field_validator("file_name")
    @classmethod
    def _file_name(cls, value: str) -> str:
        if not _SCRIPT_NAME.match(value):
            raise ValueError(f"script file name {value!r}: use letters, digits and _ . + - (at most 128)")
        return value

    @field_validator("options", "args")
    @classmethod
    def _words(cls, value: list[str]) -> list[str]:
        for word in value:
            if "\x00" in word or len(word) > 4096:
                raise ValueError(f"{word[:40]!r}: a word of at most 4096 characters, without NUL")
        return value

    @model_validator(mode="after")
    def _readable(self) -> JobScript:
        from corral.sbatch_script import ScriptError, parse_options, read_script

        try:
            read_script(self.text, self.file_name)
            parse_options([(w, 0, 0) for w in self.options], "command line")
        except ScriptError as exc:
            raise ValueError(str(exc)) from None
        return self


class SlurmOptions(BaseModel):
    """Slurm options passed through to sbatch unchanged, for clusters that need them."""

    model_config = ConfigDict(extra="forbid")

    time: str | None = Field(None, description="Walltime, in any sbatch --time format (e.g. 90, 4:00:00, 2-00:00:00).")
    account: str | None = Field(None, description="sbatch --account.")
    qos: str | None = Field(None, description="sbatch --qos.")
    constraint: str | None = Field(None, description="sbatch --constraint (node features).")
    reservation: str | None = Field(None, description="sbatch --reservation.")
    sbatch_args: list[str] = Field(default_factory=list, description="Extra sbatch options, one per item, e.g. ['--exclusive'].")
    script: JobScript | None = Field(None, description="A job script to run as it is, instead of setup and run "
                                                       "(`corral sbatch`).")

    @field_validator("time")
    @classmethod
    def _time(cls, value: str | None) -> str | None:
        if value is not None and not _SLURM_TIME.match(str(value).strip()):
            raise ValueError(f"invalid time {value!r}: use minutes, HH:MM:SS or D-HH:MM:SS")
        return None if value is None else str(value).strip()

    @field_validator("account", "qos", "reservation", "constraint")
    @classmethod
    def _word(cls, value: str | None, info: ValidationInfo) -> str | None:
        syntax, allowed = _SLURM_SYNTAX[info.field_name or ""]
        if value is not None and not syntax.match(value):
            raise ValueError(f"invalid {info.field_name} {value!r}: use {allowed} (no spaces or line breaks)")
        return value

    @field_validator("sbatch_args")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        for arg in value:
            check_sbatch_arg(arg)
        return value


class RecoveryStrategy(enum.StrEnum):
    """Where a managed job goes after an infrastructure failure (SkyPilot's names)."""

    FAILOVER = "FAILOVER"  # the same cluster first, if it can still run the job; else the best other
    EAGER_NEXT_REGION = "EAGER_NEXT_REGION"  # another cluster first; the same one only if none other can
    NONE = "NONE"  # never recover: the first failure of any kind ends the job


class JobRecovery(BaseModel):
    """How a managed job (`corral jobs launch`) recovers. Infrastructure failures (node failure,
    preemption, an unreachable cluster) are recovered unless the strategy is none; failures of the task
    itself only as these say. Written `job_recovery: none`, `job_recovery: FAILOVER`, or as a mapping."""

    model_config = ConfigDict(extra="forbid")

    strategy: RecoveryStrategy | None = Field(
        None, description="FAILOVER: recover on the same cluster first; EAGER_NEXT_REGION: on another cluster "
                          "first; none: never recover. Unset: wherever the job would start soonest.")
    max_restarts_on_errors: int = Field(0, ge=0, description="Restart this many times when the task itself fails.")
    recover_on_exit_codes: list[int] = Field(default_factory=list,
                                             description="Exit codes that always mean 'restart' (e.g. 75).")

    @model_validator(mode="before")
    @classmethod
    def _strategy_alone(cls, value: Any) -> Any:
        return {"strategy": value} if isinstance(value, str) else value

    @field_validator("strategy", mode="before")
    @classmethod
    def _strategy_name(cls, value: Any) -> Any:
        if isinstance(value, str):
            named = value.strip().upper()
            if named not in RecoveryStrategy.__members__:
                raise ValueError(f"unknown strategy {value!r}: use FAILOVER, EAGER_NEXT_REGION or none")
            return named
        return value


class Checkpoint(BaseModel):
    """Where a managed job keeps its checkpoints (CORRAL_CHECKPOINT_DIR) and whether a recovery on
    another cluster copies them there first."""

    model_config = ConfigDict(extra="forbid")

    path: str | None = Field(None, description="Directory on the clusters; default ~/.corral/checkpoints/<job id>.")
    sync: bool = Field(True, description="Copy the latest checkpoint when recovery moves the job to another cluster.")

    @field_validator("path")
    @classmethod
    def _path(cls, value: str | None) -> str | None:
        return None if value is None else check_line(value, "checkpoint path")


_AUTOSTOP = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([mhdw]?)\s*$", re.I | re.ASCII)
_MINUTES_PER = {"": 1, "m": 1, "h": 60, "d": 24 * 60, "w": 7 * 24 * 60}
DEFAULT_AUTOSTOP_MINUTES = 5.0  # SkyPilot's, for `autostop: true`


class Autostop(BaseModel):
    """SkyPilot's autostop: here, a dev allocation (`corral launch -c NAME`) idle this long is released.
    Written `true` (5 minutes), `false` (never), minutes (`10`), a duration (`10h`, `1d`, `1w`), or a
    mapping."""

    model_config = ConfigDict(extra="forbid")

    idle_minutes: float | None = Field(None, ge=0, description="Idle minutes before release; 0: never.")
    down: bool | None = Field(None, description="SkyPilot: tear down instead of stop. An allocation is always released.")
    wait_for: str | None = Field(None, description="SkyPilot: what counts as activity (jobs_and_ssh, jobs, none).")
    hook: str | None = Field(None, description="SkyPilot: a command run before stopping. Not run by Corral.")
    hook_timeout: int | None = Field(None, description="SkyPilot: the hook's timeout in seconds.")

    @model_validator(mode="before")
    @classmethod
    def _short_forms(cls, value: Any) -> Any:
        if isinstance(value, bool):
            return {"idle_minutes": DEFAULT_AUTOSTOP_MINUTES if value else 0}
        if isinstance(value, int | float | str):
            match = _AUTOSTOP.match(str(value))
            if not match:
                raise ValueError(f"invalid autostop {value!r}: use true, false, minutes, or a duration such as "
                                 "30m, 10h, 1d or 1w")
            return {"idle_minutes": float(match.group(1)) * _MINUTES_PER[match.group(2).lower()]}
        return value


class Resources(BaseModel):
    """What the task needs on each node. The fields after `any_of`/`ordered` are SkyPilot's that have no
    meaning on a Slurm cluster: accepted so its task files run unchanged, each named in one warning line
    (`task_compat.py`)."""

    model_config = ConfigDict(extra="forbid")

    accelerators: str | dict[str, int | None] | list[str] | None = Field(
        None, description="GPUs per node: 'H100:8' or {H100: 8}; a list ['H100:8', 'A100:8'] tries them in order, "
                          "a set {H100:8, A100:8} as equals."
    )
    cpus: int | float | str | None = Field(None, description="CPUs per node: N, or N+ for at least N.")
    memory: int | float | str | None = Field(
        None, description="Memory per node in GB: N, or N+ for at least N; units KB, MB, GB, TB (e.g. 512MB, 1TB+).")
    infra: str | None = Field(None, description=f"{INFRA_FORMS}. Another kind (aws, gcp, …): an alternative "
                                                "Corral skips, with a warning.")
    cloud: str | None = Field(None, description="SkyPilot's older form: `cloud: slurm`, `region: <cluster>`, "
                                                "`zone: <partition>` mean infra slurm/<cluster>/<partition>.")
    region: str | None = Field(None, description="With cloud: the cluster.")
    zone: str | None = Field(None, description="With cloud and region: the partition.")
    image_id: str | dict[str, str] | None = Field(
        None, description="Container image (docker:<image>); needs a container runtime on the cluster. A VM image "
                          "(an AMI, a per-region mapping) has no meaning on Slurm: ignored, with a warning.")
    autostop: Autostop | None = Field(None, description="Dev allocations: release after this long idle "
                                                        "(true: 5 minutes, false: never, 10, 10h, 1d, …).")
    job_recovery: JobRecovery | None = Field(None, description="Managed jobs: when and where to restart after a failure.")
    paths: list[str] | None = Field(
        None, description="Corral's own: paths the task needs on the cluster (a dataset on its filesystem); placement "
                          "picks only clusters where all exist. $USER, $HOME and ~ expand there.")
    any_of: list[Resources] | None = Field(None, description="Alternatives, any of which will do.")
    ordered: list[Resources] | None = Field(None, description="Alternatives in order of preference.")
    # SkyPilot's fields for clouds, with no meaning on Slurm: ignored with one warning line each.
    accelerator_args: dict[str, Any] | None = Field(None, description="SkyPilot: TPU settings. Ignored on Slurm.")
    instance_type: str | None = Field(None, description="SkyPilot: a cloud VM type. Ignored on Slurm.")
    use_spot: bool | None = Field(None, description="SkyPilot: spot VMs. Ignored on Slurm (a preemptible partition "
                                                    "or QOS is the cluster profile's to choose).")
    disk_size: int | str | None = Field(None, description="SkyPilot: the VM's disk. Ignored on Slurm.")
    disk_tier: str | None = Field(None, description="SkyPilot: the VM's disk tier. Ignored on Slurm.")
    network_tier: str | None = Field(None, description="SkyPilot: the VMs' network. Ignored on Slurm.")
    max_hourly_cost: float | None = Field(None, description="SkyPilot: a price cap. Ignored on Slurm.")
    ports: int | str | list[int | str] | None = Field(
        None, description="SkyPilot: ports opened to the Internet. Ignored on Slurm (`corral ssh` forwards ports).")
    labels: dict[str, str] | None = Field(None, description="SkyPilot: VM or pod labels. Ignored on Slurm.")

    @field_validator("accelerators")
    @classmethod
    def _accelerators(cls, value: Any) -> Any:
        for item in _accelerator_items(value):
            parse_accelerator(item)
        return value

    @field_validator("paths")
    @classmethod
    def _paths(cls, value: list[str] | None) -> list[str] | None:
        for path in value or []:
            if not SAFE_PATH.match(path) or len(path) > 1024:
                raise ValueError(f"paths: {path!r}: use {SAFE_PATH_CHARS} (no spaces, quotes or other $)")
        return value

    @field_validator("cpus")
    @classmethod
    def _cpus(cls, value: Any) -> Any:
        if value is not None:
            parse_amount(value, "cpus")
        return value

    @field_validator("memory")
    @classmethod
    def _memory(cls, value: Any) -> Any:
        if value is not None:
            parse_memory(value)
        return value

    @field_validator("infra")
    @classmethod
    def _infra(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                return str(parse_any_infra(value))
            except CorralError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("image_id")
    @classmethod
    def _image(cls, value: str | dict[str, str] | None) -> str | dict[str, str] | None:
        if isinstance(value, str) and value.startswith("docker:") and not _IMAGE.match(value):
            raise ValueError(f"invalid image_id {value!r}: expected docker:<image>[:tag]")
        if isinstance(value, str):
            check_line(value, "image_id", max_length=1024)
        return value

    @model_validator(mode="after")
    def _one_kind_of_alternatives(self) -> Resources:
        if self.cloud is None and (self.region or self.zone):
            raise ValueError("region and zone need cloud (e.g. cloud: slurm, region: <cluster>); or use infra")
        if self.cloud is not None and self.infra is not None:
            raise ValueError("use either infra or cloud/region/zone, not both")
        if self.zone and not self.region:
            raise ValueError("zone (a partition) needs region (its cluster)")
        if self.any_of and self.ordered:
            raise ValueError("use either any_of or ordered, not both")
        for alternative in (self.any_of or []) + (self.ordered or []):
            if alternative.any_of or alternative.ordered:
                raise ValueError("any_of and ordered take one level of alternatives: an alternative cannot "
                                 "have its own any_of or ordered")
        return self

    def accelerator_requests(self) -> list[AcceleratorRequest]:
        return [parse_accelerator(item) for item in _accelerator_items(self.accelerators)]

    def infra_text(self) -> str | None:
        """`infra`, or what the older `cloud`/`region`/`zone` say."""
        if self.cloud is None:
            return self.infra
        return "/".join(p for p in (self.cloud, self.region, self.zone) if p)

    def accelerators_ordered(self) -> bool:
        """A list of accelerators is tried in order (SkyPilot); a set (a mapping of `NAME:N` to nothing)
        or a single one, as equals."""
        return isinstance(self.accelerators, list)


def _accelerator_items(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):  # {H100: 8}, or SkyPilot's set {H100:8, A100:8} (keys with no values)
        return [name if count is None else f"{name}:{count}" for name, count in value.items()]
    return [str(v) for v in value]


class Task(BaseModel):
    """A portable task: runs unchanged on any cluster."""

    model_config = ConfigDict(extra="forbid")

    name: str | None = Field(None, description="A name for the job (shown in queue).")
    workdir: str | None = Field(None, description="Local directory synced to the job's working directory.")
    num_nodes: int = Field(1, ge=1, description="Number of nodes; setup and run execute on each.")
    resources: Resources = Field(default_factory=Resources)
    envs: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict, description="Environment variables; a null value must be given with --env."
    )
    secrets: dict[str, str | int | float | bool | None] = Field(
        default_factory=dict,
        description="Environment variables whose values are secret: never stored in plain text, redacted in "
                    "every listing; a null value must be given with --secret KEY=VALUE (or --secret KEY, "
                    "from your environment).",
    )
    file_mounts: dict[str, str] = Field(
        default_factory=dict,
        description="Remote path: local path (copied with rsync). Relative remote paths are under the job's "
                    "directory. SkyPilot's mapping form ({source: ./data, mode: COPY}) takes its source; every "
                    "mode is a copy here.")
    setup: str | None = Field(None, description="Commands run on every node before run.")
    run: str | None = Field(None, description="Commands run on every node.")
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)
    checkpoint: Checkpoint | None = Field(None, description="Managed jobs: checkpoint directory and its sync.")
    config: dict[str, Any] | None = Field(
        None, description="SkyPilot: per-task settings for its clouds and Kubernetes (docker, kubernetes, gcp, "
                          "nvidia_gpus). Ignored on Slurm, with a warning.")
    service: dict[str, Any] | None = Field(
        None, description="SkyPilot: a SkyServe service (replicas, readiness probe). Corral runs the task as a job, "
                          "with a warning that no service is set up.")

    @field_validator("file_mounts", mode="before")
    @classmethod
    def _mount_forms(cls, value: Any) -> Any:
        if not isinstance(value, dict):
            return value
        return {remote: _mount_source(remote, local) for remote, local in value.items()}

    @field_validator("envs", "secrets")
    @classmethod
    def _env_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key, item in value.items():
            if not _ENV_NAME.match(key) or key == "_":
                raise ValueError(f"invalid environment variable name {key!r}")
            if key.startswith(RESERVED_ENV_PREFIX):
                raise ValueError(f"{key}: names starting with {RESERVED_ENV_PREFIX} are Corral's own variables")
            if isinstance(item, str) and "\x00" in item:
                raise ValueError(f"{key}: an environment value cannot hold a NUL character")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None:
            check_line(value, "name", max_length=MAX_NAME_LENGTH)
        return value

    @field_validator("workdir")
    @classmethod
    def _workdir(cls, value: str | None) -> str | None:
        return None if value is None else check_line(value, "workdir")

    @field_validator("file_mounts")
    @classmethod
    def _mounts(cls, value: dict[str, str]) -> dict[str, str]:
        for remote, local in value.items():
            check_line(remote, "file_mounts remote path")
            check_line(local, f"file_mounts[{remote!r}] local path")
            try:
                check_source(local)
            except ValueError as exc:
                raise ValueError(f"{remote!r}: {exc}") from None
        return value

    @field_validator("setup", "run")
    @classmethod
    def _commands(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError(f"{info.field_name} cannot hold a NUL character")
        return value

    @model_validator(mode="after")
    def _bounded_alternatives(self) -> Task:
        count = len(_all_options(self.resources))
        if not resource_options(self.resources):
            foreign = ", ".join(foreign_alternatives(self.resources))
            raise ValueError(f"resources: every alternative is on infra Corral does not run ({foreign}); "
                             f"Corral runs on Slurm clusters, SSH pools and Kubernetes: use infra {INFRA_FORMS}")
        if count > MAX_RESOURCE_OPTIONS:
            raise ValueError(f"resources: {count} alternatives after expanding any_of/ordered and accelerator "
                             f"lists; at most {MAX_RESOURCE_OPTIONS}")
        overlap = set(self.envs) & set(self.secrets)
        if overlap:
            raise ValueError(f"{', '.join(sorted(overlap))}: in both envs and secrets; keep each in one")
        return self


_MOUNT_KEYS = ("name", "source", "store", "persistent", "mode", "config")
_MOUNT_MODES = ("MOUNT", "COPY", "MOUNT_CACHED")


def _mount_source(remote: Any, value: Any) -> Any:
    """SkyPilot's mapping form of a file mount, as the source Corral copies; other forms as they are."""
    if not isinstance(value, dict):
        return value
    where = repr(remote)
    for key in value:
        if key not in _MOUNT_KEYS:
            close = difflib.get_close_matches(str(key), _MOUNT_KEYS, n=1)
            raise ValueError(f"{where}.{key}: unknown field; " + (f"did you mean {close[0]!r}?" if close else
                                                                  f"known fields: {', '.join(_MOUNT_KEYS)}"))
    if value.get("store") == "volume":
        raise ValueError(f"{where}: volumes are a cloud's disks, which Slurm clusters do not have; name a path on "
                         "the cluster's filesystem instead")
    mode = str(value.get("mode", "MOUNT")).upper()
    if mode not in _MOUNT_MODES:
        raise ValueError(f"{where}.mode: {value.get('mode')!r}: use MOUNT, COPY or MOUNT_CACHED")
    source = value.get("source")
    if not source and isinstance(value.get("name"), str) and value.get("store"):
        source = f"{value['store']}://{value['name']}"  # an existing bucket named, as SkyPilot allows
    if not isinstance(source, str) or not source:
        raise ValueError(f"{where}: needs a source (a local path or a bucket URI), or an existing bucket's name "
                         "and store; a new empty bucket has no meaning on Slurm")
    return source


@dataclass(frozen=True)
class ResourceOption:
    """One concrete alternative of a task's resources, after expanding lists, any_of and ordered."""

    accelerator: AcceleratorRequest | None
    cpus: Amount | None
    memory_gb: Amount | None
    infra: InfraSelector
    image_id: str | None
    preference: int  # 0 is most preferred; equal for any_of alternatives
    paths: tuple[str, ...] = ()  # that must exist on the cluster

    def describe(self) -> str:
        parts = [str(self.accelerator) if self.accelerator else "no GPU"]
        if self.cpus:
            parts.append(f"cpus={self.cpus}")
        if self.memory_gb:
            parts.append(f"memory={self.memory_gb}GB")
        return ", ".join(parts)


def resource_options(resources: Resources) -> list[ResourceOption]:
    """Every alternative the task accepts on infra Corral runs, each with its preference rank (an
    `ordered` alternative's, then its place in an accelerator list). Others: `foreign_alternatives`."""
    return [option for option in _all_options(resources) if supported(option.infra)]


def foreign_alternatives(resources: Resources) -> list[str]:
    """The infras of alternatives Corral skips (aws, k8s/…: kinds it does not run), as written."""
    return list(dict.fromkeys(str(o.infra) for o in _all_options(resources) if not supported(o.infra)))


def _all_options(resources: Resources) -> list[ResourceOption]:
    out: list[ResourceOption] = []

    def expand(res: Resources, base: Resources | None, preference: int) -> None:
        merged = _merge(base, res)
        requests = merged.accelerator_requests() or [None]
        infra = merged.infra_text()
        for index, request in enumerate(requests):
            out.append(
                ResourceOption(
                    accelerator=request,
                    cpus=parse_amount(merged.cpus, "cpus") if merged.cpus is not None else None,
                    memory_gb=parse_memory(merged.memory) if merged.memory is not None else None,
                    infra=parse_any_infra(infra) if infra else InfraSelector(),
                    image_id=merged.image_id if isinstance(merged.image_id, str) and
                    merged.image_id.startswith("docker:") else None,
                    preference=preference * MAX_RESOURCE_OPTIONS + (index if merged.accelerators_ordered() else 0),
                    paths=tuple(merged.paths or ()),
                )
            )

    if resources.ordered:
        for i, alternative in enumerate(resources.ordered):
            expand(alternative, resources, i)
    elif resources.any_of:
        for alternative in resources.any_of:
            expand(alternative, resources, 0)
    else:
        expand(resources, None, 0)
    return out


def _merge(base: Resources | None, override: Resources) -> Resources:
    if base is None:
        return override
    data = base.model_dump(exclude={"any_of", "ordered", "job_recovery"}, exclude_none=True)
    if override.infra is not None or override.cloud is not None:  # an alternative's place replaces the base's
        for key in ("infra", "cloud", "region", "zone"):
            data.pop(key, None)
    data.update(override.model_dump(exclude={"any_of", "ordered", "job_recovery"}, exclude_none=True))
    return Resources(**data)


# ---- loading --------------------------------------------------------------------------------------

def _field_names(model: type[BaseModel]) -> list[str]:
    return list(model.model_fields)


def _model_at(loc: tuple[Any, ...]) -> type[BaseModel]:
    model: type[BaseModel] = Task
    for part in loc:
        if isinstance(part, int) or part not in model.model_fields:
            continue
        annotation = model.model_fields[part].annotation
        for candidate in (Resources, SlurmOptions, JobRecovery, Autostop, Checkpoint):
            if candidate is annotation or candidate in getattr(annotation, "__args__", ()):
                model = candidate
            elif any(candidate in getattr(a, "__args__", ()) for a in getattr(annotation, "__args__", ())):
                model = candidate
    return model


def _loc_part(part: Any) -> str:
    """A field name as is; a user's key (any text) quoted, so that it cannot break the line."""
    text = str(part)
    return text if isinstance(part, int) or text.isidentifier() else repr(text)


def format_validation_error(exc: ValidationError, source: str) -> str:
    problems = []
    for error in exc.errors():
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p in ("str", "int", "float", "bool",
                                                                                   "list[str]", "dict[str,int]")))
        path = ".".join(_loc_part(p) for p in loc) or "(top level)"
        if error["type"] == "extra_forbidden":
            field = _loc_part(loc[-1]).strip("'\"")
            known = _field_names(_model_at(loc[:-1]))
            close = difflib.get_close_matches(field, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(known)}"
            problems.append(f"{path}: unknown field; {hint}")
        else:
            message = " ".join(error["msg"].removeprefix("Value error, ").split())
            problems.append(f"{path}: {message}")
    # One line per distinct problem (a union type reports each branch).
    unique = list(dict.fromkeys(problems))
    return f"{source}: invalid task: " + "; ".join(unique)


def parse_task(data: Any, source: str) -> Task:
    if data is None:
        data = {}
    if not isinstance(data, dict):
        raise TaskError(f"{source}: a task file must be a mapping of fields (name, resources, run, …)")
    try:
        return Task.model_validate(data)
    except ValidationError as exc:
        raise TaskError(format_validation_error(exc, source)) from None


def load_task(path: Path) -> Task:
    """Read and validate a task file (bounds: `corral.taskfile`)."""
    return parse_task(parse_yaml(read_task_text(path), str(path)), str(path))


def apply_overrides(
    task: Task,
    source: str,
    *,
    name: str | None = None,
    gpus: str | None = None,
    infra: str | None = None,
    num_nodes: int | None = None,
    cpus: str | None = None,
    memory: str | None = None,
    envs: list[str] | tuple[str, ...] = (),
    secrets: list[str] | tuple[str, ...] = (),
    workdir: str | None = None,
    image_id: str | None = None,
) -> Task:
    """Command-line overrides on top of a task; validated like the file itself. `--secret KEY=VALUE`,
    or `--secret KEY` for the value of KEY in this process's environment."""
    data = task.model_dump(exclude_none=True)
    resources = data.setdefault("resources", {})
    if name is not None:
        data["name"] = name
    if gpus is not None:
        resources["accelerators"] = gpus
        for alternatives in ("any_of", "ordered"):
            for alt in resources.get(alternatives, []):
                alt.pop("accelerators", None)
    if infra is not None:
        resources["infra"] = infra
        for place in (resources, *resources.get("any_of", []), *resources.get("ordered", [])):
            for key in ("cloud", "region", "zone") if place is resources else ("infra", "cloud", "region", "zone"):
                place.pop(key, None)
    if workdir is not None:
        data["workdir"] = workdir
    if image_id is not None:
        resources["image_id"] = image_id
        for alt in (*resources.get("any_of", []), *resources.get("ordered", [])):
            alt.pop("image_id", None)
    if cpus is not None:
        resources["cpus"] = cpus
    if memory is not None:
        resources["memory"] = memory
    if num_nodes is not None:
        data["num_nodes"] = num_nodes
    elif "num_nodes" not in task.model_fields_set:
        data.pop("num_nodes", None)  # still unsaid: an exec then runs on all of its allocation's nodes
    env = dict(data.get("envs", {}))
    for item in envs:
        key, sep, value = item.partition("=")
        if not sep:
            raise TaskError(f"--env {item!r}: expected KEY=VALUE")
        env[key] = value
    data["envs"] = env
    hidden = dict(data.get("secrets", {}))
    for item in secrets:
        key, sep, value = item.partition("=")
        if not sep:
            if key not in os.environ:
                raise TaskError(f"--secret {key!r}: {key} is not set in your environment; pass --secret {key}=VALUE")
            value = os.environ[key]
        hidden[key] = value
        env.pop(key, None)  # a secret given on the command line replaces an env of the same name
    data["secrets"] = hidden
    return parse_task(data, source)


def _as_strings(values: dict[str, Any], source: str, what: str, flag: str) -> dict[str, str]:
    """Env values as strings (YAML booleans as true/false); a null one must have been given with `flag`."""
    missing = [k for k, v in values.items() if v is None]
    if missing:
        raise TaskError(f"{source}: {what} {', '.join(missing)} must be given a value: pass "
                        + " ".join(flag.format(k=k) for k in missing))
    return {k: ("true" if v else "false") if isinstance(v, bool) else str(v) for k, v in values.items()}


def resolved_envs(task: Task, source: str) -> dict[str, str]:
    """The task's environment as strings; a variable declared null must have been given with --env."""
    return _as_strings(task.envs, source, "envs", "--env {k}=…")


def resolved_secrets(task: Task, source: str) -> dict[str, str]:
    """The task's secret values as strings; a secret declared null must have been given with --secret."""
    return _as_strings(task.secrets, source, "secrets",
                       "--secret {k}=… (or --secret {k} to take it from your environment)")


def job_environment(task: Task, source: str) -> dict[str, str]:
    """Everything the job's environment gets from the task: envs, then secrets."""
    return {**resolved_envs(task, source), **resolved_secrets(task, source)}


def redacted_json(task: Task) -> str:
    """The task as the state store keeps it: secret values left out (they are sealed apart)."""
    data = task.model_dump(mode="json")
    data["secrets"] = {key: None for key in task.secrets}
    return json.dumps(data)


def task_json_schema() -> dict[str, Any]:
    return Task.model_json_schema()
