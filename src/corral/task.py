"""The task YAML: pydantic models that are also the docs and the JSON Schema (`corral schema`).

Fields are named as SkyPilot names them, so its users' task files run unchanged: `name`, `workdir`,
`num_nodes`, `envs`, `file_mounts` (remote path: local path), `setup`, `run`, and `resources` with
`accelerators`, `cpus`, `memory`, `infra`, `image_id`, `any_of` and `ordered`. Slurm options that have
no portable meaning go under `slurm:`.
"""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator

from corral.errors import CorralError
from corral.infra.selector import InfraSelector, parse_infra

_ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
_SLURM_TIME = re.compile(r"^(\d+|\d+:\d{1,2}|\d+:\d{1,2}:\d{1,2}|\d+-\d+|\d+-\d+:\d{1,2}|\d+-\d+:\d{1,2}:\d{1,2}|UNLIMITED|INFINITE)$", re.I)
_AMOUNT = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*(\+?)\s*$")
_IMAGE = re.compile(r"^(docker:)?[a-z0-9][a-z0-9._\-/:@]*$", re.I)


class TaskError(CorralError):
    """A task file or a command-line override that cannot be used; names the file and field."""


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

    @field_validator("sbatch_args")
    @classmethod
    def _args(cls, value: list[str]) -> list[str]:
        for arg in value:
            if not arg.startswith("-"):
                raise ValueError(f"sbatch option {arg!r} must start with '-' (one option per item, e.g. --exclusive)")
            if "\n" in arg:
                raise ValueError(f"sbatch option {arg!r} must be one line")
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
                parse_infra(value)
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
    file_mounts: dict[str, str] = Field(
        default_factory=dict, description="Remote path: local path. Relative remote paths are under the job's directory."
    )
    setup: str | None = Field(None, description="Commands run on every node before run.")
    run: str | None = Field(None, description="Commands run on every node.")
    slurm: SlurmOptions = Field(default_factory=SlurmOptions)
    checkpoint: Checkpoint | None = Field(None, description="Managed jobs: checkpoint directory and its sync.")

    @field_validator("envs")
    @classmethod
    def _env_names(cls, value: dict[str, Any]) -> dict[str, Any]:
        for key in value:
            if not _ENV_NAME.match(key) or key == "_":
                raise ValueError(f"invalid environment variable name {key!r}")
        return value

    @field_validator("name")
    @classmethod
    def _name(cls, value: str | None) -> str | None:
        if value is not None and (not value.strip() or "\n" in value):
            raise ValueError("name must be one non-empty line")
        return value


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


def format_validation_error(exc: ValidationError, source: str) -> str:
    problems = []
    for error in exc.errors():
        loc = tuple(p for p in error["loc"] if not (isinstance(p, str) and p in ("str", "int", "float", "bool",
                                                                                   "list[str]", "dict[str,int]")))
        path = ".".join(str(p) for p in loc) or "(top level)"
        if error["type"] == "extra_forbidden":
            field = str(loc[-1])
            known = _field_names(_model_at(loc[:-1]))
            close = difflib.get_close_matches(field, known, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"known fields: {', '.join(known)}"
            problems.append(f"{path}: unknown field; {hint}")
        else:
            message = error["msg"].removeprefix("Value error, ")
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
    import yaml

    try:
        text = path.read_text()
    except FileNotFoundError:
        raise TaskError(f"{path}: task file not found") from None
    except OSError as exc:
        raise TaskError(f"{path}: cannot read task file: {exc.strerror}") from None
    try:
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{path}:{mark.line + 1}:{mark.column + 1}" if mark else str(path)
        problem = getattr(exc, "problem", None) or str(exc)
        raise TaskError(f"{where}: invalid YAML: {problem}") from None
    return parse_task(data, str(path))


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
) -> Task:
    """Command-line overrides on top of a task; validated like the file itself."""
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
    return parse_task(data, source)


def resolved_envs(task: Task, source: str) -> dict[str, str]:
    """The task's environment as strings; a variable declared null must have been given with --env."""
    missing = [k for k, v in task.envs.items() if v is None]
    if missing:
        raise TaskError(
            f"{source}: envs {', '.join(missing)} must be given a value: pass "
            + " ".join(f"--env {k}=…" for k in missing)
        )
    out = {}
    for key, value in task.envs.items():
        out[key] = ("true" if value else "false") if isinstance(value, bool) else str(value)
    return out


def task_json_schema() -> dict[str, Any]:
    return Task.model_json_schema()
