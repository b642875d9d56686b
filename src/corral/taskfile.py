"""Reading a task file, in bounded time and memory, without validating it: the thin CLI reads the file
here (to find the local files it must send) and the server validates the same text (`corral.task`).

Bounds: at most MAX_TASK_FILE_BYTES of UTF-8, and YAML of at most MAX_YAML_NODES nodes in all its
documents (aliases counted at each use) nested at most MAX_YAML_DEPTH deep. A file of several documents
is a pipeline or a job group (`pipeline_tasks`): each task's own text is cut from the file for the server
to read.
Costs one PyYAML import (~10 ms).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, BinaryIO

from corral.errors import TaskError

MAX_TASK_FILE_BYTES = 1024 * 1024
MAX_YAML_NODES = 20_000  # every scalar, list and mapping, aliases counted each time they are used
MAX_YAML_DEPTH = 32
# A sweep's size: Slurm's default MaxJobCount is 10,000 jobs for a whole cluster.
MAX_SWEEP_JOBS = 10_000


def source_scheme(source: str) -> str | None:
    """A file mount's object-storage scheme (`s3` for s3://…), or None for a local path: the one rule the
    CLI (what to send) and the server (what to fetch) share."""
    name, sep, _ = source.partition("://")
    return name.lower() if sep and name.isalnum() else None


def check_num_jobs(num_jobs: int) -> int:
    if not 1 <= num_jobs <= MAX_SWEEP_JOBS:
        raise TaskError(f"--num-jobs {num_jobs}: a sweep has 1 to {MAX_SWEEP_JOBS:,} jobs (Slurm's default "
                        "MaxJobCount holds 10,000 jobs per cluster); launch larger sweeps in parts")
    return num_jobs


def read_task_text(path: Path, kind: str = "task file") -> str:
    """A task file's text (or a job script's: `kind`), refused when missing, too large or not UTF-8."""
    try:
        with open(path, "rb") as f:
            return read_task_stream(f, str(path), kind)
    except FileNotFoundError:
        raise TaskError(f"{path}: {kind} not found") from None
    except IsADirectoryError:
        raise TaskError(f"{path}: is a directory, not a {kind}") from None
    except OSError as exc:
        raise TaskError(f"{path}: cannot read {kind}: {exc.strerror or exc}") from None
    except ValueError:  # a NUL in the name
        raise TaskError(f"{str(path)!r}: not a file name (it holds a NUL character)") from None


def read_task_stream(stream: BinaryIO, source: str, kind: str = "task file") -> str:
    """The text of a task (or a job script: `kind`) read from `stream` (a file, standard input), refused
    when too large or not UTF-8; `source` names it in the error."""
    raw = stream.read(MAX_TASK_FILE_BYTES + 1)
    if len(raw) > MAX_TASK_FILE_BYTES:
        raise TaskError(f"{source}: {kind} is larger than {MAX_TASK_FILE_BYTES // 1024} KiB; "
                        "keep data in file_mounts, not in the task")
    try:
        return raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise TaskError(f"{source}: not UTF-8 text (byte {exc.start}); save the {kind} as UTF-8") from None


def parse_yaml(text: str, source: str) -> Any:
    """One YAML document, refused when it would expand beyond MAX_YAML_NODES or MAX_YAML_DEPTH. A file of
    several documents (a pipeline, a job group) is refused with where it runs: `corral jobs launch`."""
    documents = [d for d in parse_yaml_documents(text, source) if d is not None]  # a stray `---` is no task
    if len(documents) > 1:
        raise TaskError(f"{source}: holds {len(documents)} YAML documents, a pipeline (or a job group) of tasks: "
                        f"launch it as a managed job, `corral jobs launch {source}`")
    return documents[0] if documents else None


def parse_yaml_documents(text: str, source: str) -> list[Any]:
    """Every YAML document of a file (one for a task, several for a pipeline), refused when together
    they would expand beyond MAX_YAML_NODES or MAX_YAML_DEPTH."""
    return [value for _, value in _documents(text, source)]


def _documents(text: str, source: str) -> list[tuple[Any, Any]]:
    """Each YAML document's node (for where it is in the text) and value."""
    import yaml

    if len(text.encode("utf-8", errors="replace")) > MAX_TASK_FILE_BYTES:
        raise TaskError(f"{source}: task is larger than {MAX_TASK_FILE_BYTES // 1024} KiB; "
                        "keep data in file_mounts, not in the task")
    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml where PyYAML was built with it
    try:
        roots = list(yaml.compose_all(text, Loader=loader))
        _check_yaml_size(roots, source)
        return list(zip(roots, yaml.load_all(text, Loader=loader)))
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f"{source}:{mark.line + 1}:{mark.column + 1}" if mark else source
        problem = getattr(exc, "problem", None) or " ".join(str(exc).split())
        raise TaskError(f"{where}: invalid YAML: {problem}") from None
    except RecursionError:
        raise TaskError(f"{source}: YAML nested deeper than {MAX_YAML_DEPTH} levels") from None


def repeated_keys(text: str) -> list[str]:
    """Each key written twice in one mapping of YAML text (a task's, the settings'), as a path (`envs`,
    `resources.any_of[1].accelerators`), in the order written. YAML loaders, SkyPilot's too, keep the
    later value and say nothing, so the earlier block is lost. Keys that override a merge (`<<: *base`)
    are no repeats. Empty for text that does not parse (its error is the loader's to give)."""
    import yaml

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)
    try:
        roots = [root for root in yaml.compose_all(text, Loader=loader) if root is not None]
        _check_yaml_size(roots, "task")
    except (yaml.YAMLError, TaskError, RecursionError):
        return []
    found: dict[str, int] = {}
    stack: list[tuple[Any, str]] = [(root, "") for root in reversed(roots)]
    walked: set[int] = set()  # an alias is the node it names: its repeats are told where it was written
    while stack:
        node, path = stack.pop()
        if id(node) in walked:
            continue
        walked.add(id(node))
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, f"{path}[{i}]") for i, child in reversed(list(enumerate(node.value))))
        elif isinstance(node, yaml.MappingNode):
            seen: set[tuple[str, str]] = set()
            children = []
            for key, value in node.value:
                name = str(key.value) if isinstance(key, yaml.ScalarNode) else "?"
                here = f"{path}.{name}" if path else name
                if isinstance(key, yaml.ScalarNode) and key.tag != "tag:yaml.org,2002:merge":
                    if (key.tag, key.value) in seen:
                        found.setdefault(here, key.start_mark.index)
                    seen.add((key.tag, key.value))
                children.append((value, here))
            stack.extend(reversed(children))  # walked in the order written
    return sorted(found, key=found.__getitem__)


PIPELINE_HEADER_KEYS = frozenset({"name", "execution", "primary_tasks", "termination_delay"})
GROUP_ONLY_KEYS = ("primary_tasks", "termination_delay")


def pipeline_tasks(text: str, source: str) -> tuple[dict[str, Any], list[tuple[str, Any]]] | None:
    """A file of several tasks: its header and its tasks, each as its own YAML text and value; None for
    a file of one document. As SkyPilot reads it: a first document of no more than `name`, `execution`
    and a job group's `primary_tasks` and `termination_delay` is the header; every other document is a
    task. `execution: serial` (the default) is a pipeline, its tasks run one after another in the order
    written; `execution: parallel` is a job group, its tasks run side by side. The header's values are
    checked where the file is recorded (the server), but for what decides how to read the file."""
    text = text.removeprefix("\ufeff")  # YAML reads past a byte order mark: its marks count from after it
    found = [(node, value) for node, value in _documents(text, source) if value is not None]
    if len(found) < 2:
        return None
    header: dict[str, Any] = {}
    first = found[0][1]
    if isinstance(first, dict) and first and set(first) <= PIPELINE_HEADER_KEYS:
        header, found = first, found[1:]
    documents = [(_text_of(text, node, value), value) for node, value in found]
    execution = header.get("execution", "serial")
    if execution not in ("serial", "parallel"):
        raise TaskError(f"{source}: execution: {execution!r}: give `serial` (a pipeline, its tasks run one after "
                        "another) or `parallel` (a job group, its tasks run side by side)")
    if execution == "serial" and (given := [k for k in GROUP_ONLY_KEYS if k in header]):
        raise TaskError(f"{source}: {given[0]}: only a job group has it (`execution: parallel` in the header); "
                        "a pipeline's tasks each end by themselves")
    primary = header.get("primary_tasks")
    if primary is not None and (not isinstance(primary, list) or not all(isinstance(p, str) for p in primary)):
        raise TaskError(f"{source}: primary_tasks: expected a list of the group's task names, e.g. `[trainer]`")
    delay = header.get("termination_delay")
    if delay is not None and not (_is_duration(delay) or isinstance(delay, dict) and all(
            isinstance(key, str) and _is_duration(value) for key, value in delay.items())):
        raise TaskError(f"{source}: termination_delay: expected a duration (30s, 5m, 1h, or seconds), or one per task "
                        "name, e.g. `{default: 30s, replay-buffer: 1m}`")
    name = header.get("name")
    if name is not None and not isinstance(name, str):
        raise TaskError(f"{source}: the {'job group' if execution == 'parallel' else 'pipeline'}'s name must be "
                        f"a string, not {type(name).__name__}")
    if not documents:
        raise TaskError(f"{source}: a {'job group' if execution == 'parallel' else 'pipeline'} with no task: give "
                        "each task after a `---` line")
    return header, documents


def _is_duration(value: object) -> bool:
    """Text or a number, as a duration is written (jobgroup.parse_delay reads it)."""
    return isinstance(value, (str, int, float)) and not isinstance(value, bool)


def _text_of(text: str, node: Any, value: Any) -> str:
    """One document's own text, as written: from the start of its first line (its indentation kept), or
    from where it starts when something else is before it on that line (`--- value`), to its end. Where
    that text alone would not read as `value` (a stray byte order mark in it), the value written anew."""
    import yaml

    start = node.start_mark.index
    line = text.rfind("\n", 0, start) + 1
    own = text[line if not text[line:start].strip() else start:node.end_mark.index]
    try:
        if yaml.load(own, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) == value:
            return own
    except yaml.YAMLError:
        pass
    return yaml.safe_dump(value, allow_unicode=True)


def _check_yaml_size(roots: list[Any], source: str) -> None:
    import yaml

    count = 0
    stack: list[tuple[Any, int]] = [(root, 1) for root in roots if root is not None]
    while stack:
        node, depth = stack.pop()
        count += 1
        if count > MAX_YAML_NODES:
            raise TaskError(f"{source}: YAML too large: more than {MAX_YAML_NODES} values (aliases counted "
                            "each time they are used)")
        if depth > MAX_YAML_DEPTH:
            mark = node.start_mark
            raise TaskError(f"{source}:{mark.line + 1}: YAML nested deeper than {MAX_YAML_DEPTH} levels")
        if isinstance(node, yaml.SequenceNode):
            stack.extend((child, depth + 1) for child in node.value)
        elif isinstance(node, yaml.MappingNode):
            for key, value in node.value:
                stack.append((key, depth + 1))
                stack.append((value, depth + 1))
