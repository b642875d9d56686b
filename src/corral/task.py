"""The task YAML: pydantic models that are also the docs and the JSON Schema (`corral schema`).

Fields are named as SkyPilot names them, so its users' task files run unchanged: `name`, `workdir`,
`num_nodes`, `envs`, `file_mounts` (remote path: local path), `setup`, `run`, and `resources` with
`accelerators`, `cpus`, `memory`, `infra`, `image_id`, `any_of` and `ordered`. Slurm options that have
no portable meaning go under `slurm:`.
"""

from __future__ import annotations

import difflib
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

from corral.errors import CorralError, TaskError
from corral.infra.selector import InfraSelector, parse_infra
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


class SlurmOptions(BaseModel):
    """Slurm options passed through to sbatch unchanged, for clusters that need them."""

    model_config = ConfigDict(extra="forbid")

    time: str | None = Field(None, description="Walltime, in any sbatch --time format (e.g. 90, 4:00:00, 2-00:00:00).")
    account: str | None = Field(None, description="sbatch --account.")
    qos: str | None = Field(None, description="sbatch --qos.")
    constraint: str | None = Field(None, description="sbatch --constraint (node features).")
    reservation: str | None = Field(None, description="sbatch --reservation.")
    sbatch_args: list[str] = Field(default_factory=list, description="Extra sbatch options, one per item, e.g. ['--exclusive'].")

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


class JobRecovery(BaseModel):
    """How a managed job (`corral jobs launch`) recovers. Infrastructure failures (node failure,
    preemption, an unreachable cluster) are always recovered; failures of the task itself only so."""

    model_config = ConfigDict(extra="forbid")

    max_restarts_on_errors: int = Field(0, ge=0, description="Restart this many times when the task itself fails.")
    recover_on_exit_codes: list[int] = Field(default_factory=list,
                                             description="Exit codes that always mean 'restart' (e.g. 75).")


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


class Resources(BaseModel):
    """What the task needs on each node."""

    model_config = ConfigDict(extra="forbid")

    accelerators: str | dict[str, int] | list[str] | None = Field(
        None, description="GPUs per node: 'H100:8', {H100: 8}, or a list of alternatives ['H100:8', 'A100:8']."
    )
    cpus: int | float | str | None = Field(None, description="CPUs per node: N, or N+ for at least N.")
    memory: int | float | str | None = Field(None, description="Memory per node in GB: N, or N+ for at least N.")
    infra: str | None = Field(None, description="slurm, slurm/<cluster> or slurm/<cluster>/<partition>.")
    image_id: str | None = Field(None, description="Container image (docker:<image>); needs a container runtime on the cluster.")
    job_recovery: JobRecovery | None = Field(None, description="Managed jobs: when to restart after a failure.")
    any_of: list[Resources] | None = Field(None, description="Alternatives, any of which will do.")
    ordered: list[Resources] | None = Field(None, description="Alternatives in order of preference.")

    @field_validator("accelerators")
    @classmethod
    def _accelerators(cls, value: Any) -> Any:
        for item in _accelerator_items(value):
            parse_accelerator(item)
        return value

    @field_validator("cpus", "memory")
    @classmethod
    def _amount(cls, value: Any, info: ValidationInfo) -> Any:
        if value is not None:
            parse_amount(value, info.field_name or "amount")
        return value

    @field_validator("infra")
    @classmethod
    def _infra(cls, value: str | None) -> str | None:
        if value is not None:
            try:
                return str(parse_infra(value))
            except CorralError as exc:
                raise ValueError(str(exc)) from None
        return value

    @field_validator("image_id")
    @classmethod
    def _image(cls, value: str | None) -> str | None:
        if value is not None and not _IMAGE.match(value):
            raise ValueError(f"invalid image_id {value!r}: expected docker:<image>[:tag]")
        return value

    @model_validator(mode="after")
    def _one_kind_of_alternatives(self) -> Resources:
        if self.any_of and self.ordered:
            raise ValueError("use either any_of or ordered, not both")
        for alternative in (self.any_of or []) + (self.ordered or []):
            if alternative.any_of or alternative.ordered:
                raise ValueError("any_of and ordered take one level of alternatives: an alternative cannot "
                                 "have its own any_of or ordered")
        return self

    def accelerator_requests(self) -> list[AcceleratorRequest]:
        return [parse_accelerator(item) for item in _accelerator_items(self.accelerators)]


def _accelerator_items(value: Any) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [f"{name}:{count}" for name, count in value.items()]
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
        default_factory=dict, description="Remote path: local path. Relative remote paths are under the job's directory."
    )
    setup: str | None = Field(None, description="Commands run on every node before run.")
    run: str | None = Field(None, description="Commands run on every node.")
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)
    checkpoint: Checkpoint | None = Field(None, description="Managed jobs: checkpoint directory and its sync.")

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
        return value

    @field_validator("setup", "run")
    @classmethod
    def _commands(cls, value: str | None, info: ValidationInfo) -> str | None:
        if value is not None and "\x00" in value:
            raise ValueError(f"{info.field_name} cannot hold a NUL character")
        return value

    @model_validator(mode="after")
    def _bounded_alternatives(self) -> Task:
        count = len(resource_options(self.resources))
        if count > MAX_RESOURCE_OPTIONS:
            raise ValueError(f"resources: {count} alternatives after expanding any_of/ordered and accelerator "
                             f"lists; at most {MAX_RESOURCE_OPTIONS}")
        overlap = set(self.envs) & set(self.secrets)
        if overlap:
            raise ValueError(f"{', '.join(sorted(overlap))}: in both envs and secrets; keep each in one")
        return self


@dataclass(frozen=True)
class ResourceOption:
    """One concrete alternative of a task's resources, after expanding lists, any_of and ordered."""

    accelerator: AcceleratorRequest | None
    cpus: Amount | None
    memory_gb: Amount | None
    infra: InfraSelector
    image_id: str | None
    preference: int  # 0 is most preferred; equal for any_of alternatives

    def describe(self) -> str:
        parts = [str(self.accelerator) if self.accelerator else "no GPU"]
        if self.cpus:
            parts.append(f"cpus={self.cpus}")
        if self.memory_gb:
            parts.append(f"memory={self.memory_gb}GB")
        return ", ".join(parts)


def resource_options(resources: Resources) -> list[ResourceOption]:
    """Every alternative the task accepts, each with its preference rank."""
    out: list[ResourceOption] = []

    def expand(res: Resources, base: Resources | None, preference: int) -> None:
        merged = _merge(base, res)
        requests = merged.accelerator_requests() or [None]
        for request in requests:
            out.append(
                ResourceOption(
                    accelerator=request,
                    cpus=parse_amount(merged.cpus, "cpus") if merged.cpus is not None else None,
                    memory_gb=parse_amount(merged.memory, "memory") if merged.memory is not None else None,
                    infra=parse_infra(merged.infra) if merged.infra else InfraSelector(),
                    image_id=merged.image_id,
                    preference=preference,
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
        for candidate in (Resources, SlurmOptions):
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
        for alternatives in ("any_of", "ordered"):
            for alt in resources.get(alternatives, []):
                alt.pop("infra", None)
    if cpus is not None:
        resources["cpus"] = cpus
    if memory is not None:
        resources["memory"] = memory
    if num_nodes is not None:
        data["num_nodes"] = num_nodes
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
