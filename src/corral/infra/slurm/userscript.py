"""A user's own sbatch script on one cluster: rewritten where the site differs, submitted as it is otherwise.

For the cluster placement picked, Corral rewrites only:
- the partition (placement's choice, within any the user pinned);
- the GPU type in `--gres`/`--gpus*` (the site's GRES spelling: `h100` -> `nvidia_h100_80gb_hbm3`);
- the account and QOS, when the cluster's profile names them;
- `--array`, only when a managed job resubmits some of its tasks;
- `--dependency` on Corral jobs (`afterok:c-…`): their Slurm ids on this cluster.

Each is changed where it is written: in its `#SBATCH` line (only that option's characters), or in the
command-line words that set it; one that is written nowhere becomes a new `#SBATCH` line after the
script's last directive. Every other byte of the script stays as written (golden-file tested).

Corral's own bookkeeping goes on sbatch's command line, never in the script: `--comment=corral-<token>`
(how a lost answer's job is found again, and how status finds the job whatever its name), `--chdir` to
the job's folder unless the script sets one, `--no-requeue`/`--hold` for managed jobs. Corral's
variables (CORRAL_*, SKYPILOT_TASK_ID, the task's envs, the profile's env and paths) are exported into
sbatch's environment, which Slurm passes to the job (unless the script says `--export=NONE`): added to
Slurm's own SLURM_* variables, never in their place.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from corral.errors import TaskError
from corral.infra.base import JobRequest
from corral.infra.shell import checkpoint_lines, render_env
from corral.infra.slurm.environment import unset_named
from corral.infra.slurm.jobscript import RUNS_DIR, submit_files_script
from corral.sbatch_script import (
    CORRAL_JOB_REF,
    DIRECTIVE,
    Option,
    array_indices,
    array_spec,
    effective,
    parse_options,
    read_script,
)
from corral.task import expandable

COMMENT_PREFIX = "corral-"
GPU_OPTIONS = ("gres", "gpus", "gpus-per-node", "gpus-per-task", "gpus-per-socket")
_SITE_WORD = re.compile(r"^[A-Za-z0-9_.,:+@%=?\-]{1,4096}\Z", re.ASCII)
_PATTERN = re.compile(r"%(\d*)([A-Za-z%])")


@dataclass(frozen=True)
class ScriptSubmission:
    """What one cluster receives: the script as rewritten, and sbatch's command line."""

    file_name: str
    text: str  # the rewritten script
    user_options: tuple[str, ...]  # the user's sbatch command-line words, rewritten where the site differs
    corral_options: tuple[str, ...]  # Corral's own (--comment, --chdir, --no-requeue, --hold)
    args: tuple[str, ...]  # the script's arguments
    run_dir: str
    log_paths: tuple[str, ...]  # per copy: relative to the home unless absolute; %j/%A/%a resolved later
    error_paths: tuple[str, ...] = ()  # the same, for an --error file apart from the log; else none

    def command(self, sbatch: str = "sbatch", home: str = "$HOME", folder: str = ".") -> str:
        """sbatch's command line; `home` stands for the login node's home in --chdir ("$HOME" shows it,
        '"$HOME"' is what the login node's shell expands), `folder` for the run folder the script is in
        (a bash word)."""
        # Corral's after the user's: the later option wins, and its comment (the job's token) must.
        # A path, never a bare name: with --chdir, sbatch looks a bare name up in PATH first (a script
        # named `sbatch` became /usr/bin/sbatch: "This does not look like a batch script"). The job's
        # name stays the file's name.
        options = " ".join(shlex.quote(w) for w in ("--parsable", *self.user_options, *self.corral_options))
        line = " ".join([sbatch, options, f"{folder}/{shlex.quote(self.file_name)}", *map(shlex.quote, self.args)])
        return line.replace(f"--chdir={_HOME_MARK}/", f"--chdir={home}/")


def is_script_request(request: JobRequest) -> bool:
    return bool(request.scheduler_options.get("script"))


def submission_for(request: JobRequest, cluster: str) -> ScriptSubmission:
    """The script and command line this request sends to `cluster` (pure)."""
    script: dict[str, Any] = dict(request.scheduler_options["script"])
    text, user_words = rewrite(
        script["text"], list(script.get("options", [])), partition=request.place,
        gpu_type=request.accelerator_type, account=request.scheduler_options.get("account"),
        qos=request.scheduler_options.get("qos"), array=request.copy_indices or None,
        dependencies=dict(script.get("dependencies") or {}))
    options = _effective(text, user_words)
    run_dir = f"{RUNS_DIR}/{request.token}"
    corral = [f"--comment={COMMENT_PREFIX}{request.token}"]
    if "chdir" not in options:
        corral.append(f"--chdir={_HOME_MARK}/{run_dir}/workdir")
    if not request.requeue:
        corral.append("--no-requeue")
    if request.held:
        corral.append("--hold")
    name = options["job-name"].value if "job-name" in options and options["job-name"].value else script["file_name"]
    logs = log_paths(options, run_dir, name or script["file_name"], request)
    errors = log_paths(options, run_dir, name or script["file_name"], request, "error")
    return ScriptSubmission(script["file_name"], text, tuple(user_words), tuple(corral), tuple(script.get("args", [])),
                            run_dir, logs, errors if errors != logs else ())


_HOME_MARK = "@HOME@"  # --chdir's $HOME, expanded by the login node's shell (see submit_script)


def log_paths(options: dict[str, Option], run_dir: str, job_name: str, request: JobRequest,
              stream: str = "output") -> tuple[str, ...]:
    """Where each copy's output goes, as Slurm will name it: the --output pattern (default slurm-%j.out,
    slurm-%A_%a.out for arrays) under the job's working directory. %x is filled in here, %a per copy;
    the rest (%j, %A, %u, %N, …) when the job's id is known (`log_glob`). With `stream="error"`, where
    its stderr goes: the --error pattern, or the output's without one, as Slurm does."""
    array = "array" in options
    error = options.get("error") if stream == "error" else None
    named = error if error is not None and error.value else options.get("output")
    pattern = named.value if named is not None and named.value else (
        "slurm-%A_%a.out" if array else "slurm-%j.out")
    base = _fill(_under_chdir(pattern, options, run_dir), {"x": job_name})
    if not array:
        return (base,)
    indices = request.copy_indices or tuple(range(len(request.task_ids)))
    return tuple(_fill(base, {"a": str(i)}) for i in indices)


def _under_chdir(pattern: str, options: dict[str, Option], run_dir: str) -> str:
    """A file pattern (--output, --error) where Slurm opens it: under the job's working directory unless
    absolute; relative to the home unless absolute. A relative --chdir is relative to where sbatch runs,
    the workdir (submit_script)."""
    chdir = options["chdir"].value if "chdir" in options and options["chdir"].value else f"{run_dir}/workdir"
    if not chdir.startswith("/"):
        chdir = chdir if chdir.startswith(RUNS_DIR) else f"{run_dir}/workdir/{chdir}"
    return pattern if pattern.startswith("/") else f"{chdir.rstrip('/')}/{pattern}"


def log_folders(options: dict[str, Option], run_dir: str) -> list[str]:
    """The folders the --output and --error files go in, for those a pattern does not name (`logs/%j.out`
    needs logs/): Slurm does not make them, and fails the job (JobLaunchFailure) when one is missing. The
    job starts in a folder of its own, where the logs/ beside the user's script is not."""
    folders = []
    for name in ("output", "error"):
        if name in options and options[name].value and "/" in options[name].value.rstrip("/"):
            folder = _under_chdir(options[name].value, options, run_dir).rsplit("/", 1)[0]
            if "%" not in folder and folder not in folders:
                folders.append(folder)
    return folders


def _fill(pattern: str, values: dict[str, str]) -> str:
    def one(match: re.Match[str]) -> str:
        width, letter = match.group(1), match.group(2)
        if letter not in values:
            return match.group(0)
        value = values[letter]
        return value.zfill(int(width)) if width and value.isdigit() else value

    return _PATTERN.sub(one, pattern)


def log_glob(log_path: str, handle: str) -> str:
    """A bash word naming the log of job `handle` (`123` or an array task's `123_4`): the pattern's
    remaining %-fields filled in, the user name from the shell, unknown ones (%N: the first node) as *."""
    base, _, index = handle.partition("_")
    fields = {"A": base, "a": index or "4294967294", "j": base if not index else "*", "u": "\0u", "%": "%",
              "n": "0", "t": "0", "s": "batch", "N": "*", "b": (index or base)[-1:]}
    out: list[str] = []
    last = 0
    for match in _PATTERN.finditer(log_path):
        out.append(shlex.quote(log_path[last:match.start()]) if match.start() > last else "")
        width, letter = match.group(1), match.group(2)
        value = fields.get(letter, "*")
        if value == "\0u":
            out.append('"$(id -un)"')
        elif value == "*":
            out.append("*")
        else:
            out.append(shlex.quote(value.zfill(int(width)) if width and value.isdigit() else value))
        last = match.end()
    if last < len(log_path):
        out.append(shlex.quote(log_path[last:]))
    word = "".join(out) or "''"
    return word if log_path.startswith("/") else '"$HOME"/' + word


def _effective(text: str, words: Sequence[str]) -> dict[str, Option]:
    return effective(parse_options([(w, i, i + 1) for i, w in enumerate(words)], "command line"),
                     read_script(text).directives)


def rewrite(text: str, words: list[str], *, partition: str, gpu_type: str | None, account: str | None,
            qos: str | None, array: Sequence[int] | None = None,
            dependencies: dict[str, str] | None = None) -> tuple[str, list[str]]:
    """The script and the command-line words with the site-specific options set for one cluster. In a
    heterogeneous job, a component that names its own partition, account or QOS gets the cluster's in
    its place; the others inherit the first component's, as Slurm propagates them."""
    script = read_script(text)
    command_line = parse_options([(w, i, i + 1) for i, w in enumerate(words)], "command line")
    line_edits: dict[int, list[tuple[tuple[int, int], str]]] = {}
    word_edits: dict[int, tuple[int, list[str]]] = {}
    inserts: dict[int, list[str]] = {}
    for component in range(script.components):
        options = effective(command_line, script.directives, component)
        first = component == 0
        changes: list[tuple[str, str]] = [("partition", partition)] if first or "partition" in options else []
        for name in GPU_OPTIONS:
            option = options.get(name)
            if option is not None and option.value and gpu_type:
                respelled = _respell(option.value, gpu_type, gres=name == "gres")
                if respelled != option.value:
                    changes.append((name, respelled))
        changes += [(name, value) for name, value in (("account", account), ("qos", qos))
                    if value and (first or name in options)]
        dependency = options.get("dependency")
        if dependencies and dependency is not None and dependency.value:
            changes.append(("dependency", CORRAL_JOB_REF.sub(lambda m: dependencies.get(m.group(1), m.group(0)),
                                                             dependency.value)))
        if first and array is not None and "array" in options:
            full, throttle = array_indices(options["array"].value or "")
            if tuple(array) != full:
                changes.append(("array", array_spec(array, throttle)))
        for name, value in changes:
            if not _SITE_WORD.match(value):
                raise TaskError(f"{name} {value!r} cannot be written into a job script (letters, digits and "
                                "_ . , : + @ % = - only)")
            option = options.get(name)
            if option is not None and option.line is None and option.span is not None:
                start, end = option.span
                word_edits[start] = (end, [f"{option.spelling}={value}"] if option.spelling.startswith("--")
                                     else [option.spelling, value])
            elif option is not None and option.line is not None and option.span is not None and _alone(
                    script.lines[option.line], option):
                spelled = (f"{option.spelling}={value}" if option.spelling.startswith("--")
                           else f"{option.spelling} {value}")
                line_edits.setdefault(option.line, []).append((option.span, spelled))
            else:
                inserts.setdefault(script.component_end(component), []).append(f"{DIRECTIVE} --{name}={value}")
    lines = script.lines
    for number, edits in line_edits.items():
        line = lines[number]
        for (start, end), spelled in sorted(edits, reverse=True):
            line = line[:start] + spelled + line[end:]
        lines[number] = line
    for after in sorted(inserts, reverse=True):
        ending = "\r\n" if lines[after].endswith("\r\n") else "\n"
        if not lines[after].endswith(("\n", "\r")):
            lines[after] += "\n"
        lines[after + 1:after + 1] = [line + ending for line in inserts[after]]
    new_words: list[str] = []
    i = 0
    while i < len(words):
        if i in word_edits:
            end, spelled = word_edits[i]
            new_words += spelled
            i = end
        else:
            new_words.append(words[i])
            i += 1
    return "".join(lines), new_words


def _alone(line: str, option: Option) -> bool:
    """Is the option its own word(s) on the line (not one letter of a bundle such as -HN2)?"""
    assert option.span is not None
    return line[option.span[0]:option.span[1]].startswith(option.spelling)


def _respell(value: str, gpu_type: str, *, gres: bool) -> str:
    """A --gres/--gpus* value with its GPU entries' type as the site spells it (untyped ones stay)."""
    items = []
    for item in value.split(","):
        head, paren, tail = item.partition("(")
        parts = head.split(":")
        offset = 1 if gres else 0
        if gres and parts[0] != "gpu":
            items.append(item)
            continue
        typed = len(parts) - offset >= 2 or (len(parts) - offset == 1 and not parts[offset].isdigit())
        if typed and parts[offset]:
            parts[offset] = gpu_type
        items.append(":".join(parts) + paren + tail)
    return ",".join(items)


def environment(request: JobRequest, cluster: str) -> str:
    """env.sh: what Corral adds to the job's environment (sourced with `set -a` before sbatch)."""
    values = {"CORRAL_CLUSTER": cluster, "CORRAL_NUM_JOBS": str(request.num_jobs),
              "CORRAL_NUM_GPUS_PER_NODE": str(request.accelerators_per_node), **request.extra_env}
    if not request.is_array:
        values |= {"CORRAL_TASK_ID": request.task_ids[0], "SKYPILOT_TASK_ID": request.task_ids[0],
                   "CORRAL_JOB_RANK": str(request.first_rank)}
    lines = "".join(f'export {name}="${{{name}-{expandable(path)}}}"\n'
                    for name, path in dict(request.scheduler_options.get("script_paths") or {}).items())
    lines += render_env(dict(request.envs)) + render_env(values)
    lines += f'export CORRAL_RUN_DIR="$HOME"/{shlex.quote(f"{RUNS_DIR}/{request.token}")}\n'
    if request.checkpoint_dir and not request.is_array:
        lines += "".join(line + "\n" for line in checkpoint_lines(request.checkpoint_dir,
                                                                   shlex.quote(request.task_ids[0])))
    return lines


def files(request: JobRequest, cluster: str, submission: ScriptSubmission) -> dict[str, str]:
    out = {submission.file_name: submission.text, "env.sh": environment(request, cluster)}
    if request.is_array:
        indices = request.copy_indices or tuple(range(len(request.task_ids)))
        out["task_ids"] = "".join(f"{i} {tid}\n" for i, tid in zip(indices, request.task_ids))
    return out


def _find(token: str) -> str:
    return (f"squeue -h --me -t all -o '%F|%k' 2>/dev/null | awk -F'|' "
            f"-v c={shlex.quote(COMMENT_PREFIX + token)} '$2 == c {{print $1; exit}}'")


def submit_script(request: JobRequest, cluster: str) -> str:
    """Write the script and env.sh, and submit it with Corral's options (idempotent by the comment)."""
    submission = submission_for(request, cluster)
    command = submission.command('"$sb"', home='"$HOME"', folder='"$d"')
    options = _effective(submission.text, submission.user_options)
    named = unset_named(options)  # the script's own account, …
    folders = " ".join(shlex.quote(f) if f.startswith("/") else f'"$HOME"/{shlex.quote(f)}'
                       for f in log_folders(options, submission.run_dir))
    made = f"mkdir -p -- {folders} 2>/dev/null; " if folders else ""
    # sbatch runs in the workdir, so that the job's SLURM_SUBMIT_DIR is where the files sent with it are,
    # as with sbatch where the user ran it (`cd $SLURM_SUBMIT_DIR` opens many scripts)
    sbatch = (' ( sb=$(command -v sbatch) || sb=sbatch; set -a; . "$d/env.sh" || exit 1; set +a; '
              f'{made}{named}cd "$d/workdir" || exit 1; exec {command} )')
    return submit_files_script(submission.run_dir, files(request, cluster, submission), _find(request.token), sbatch)


def test_only_lines(requests: Sequence[JobRequest], cluster: str, indices: Sequence[int]) -> list[str]:
    """For `sbatch --test-only`: each request's rewritten script in a temporary folder, tested there."""
    out = []
    for i, request in zip(indices, requests):
        submission = submission_for(request, cluster)
        words = " ".join(shlex.quote(w) for w in submission.user_options)
        delimiter = f"CORRAL_SCRIPT_{i}_EOF"
        while delimiter in submission.text:
            delimiter += "_"
        out.append(f"mkdir -p \"$d/s{i}\"; cat > \"$d/s{i}/job\" <<'{delimiter}'\n{submission.text}"
                   f"{'' if submission.text.endswith(chr(10)) else chr(10)}{delimiter}")
        named = unset_named(_effective(submission.text, submission.user_options))
        out.append(f"( {named}cd \"$d/s{i}\" && timeout 20 sbatch --test-only {words} ./job >\"$d/{i}\" 2>&1 ) &")
    return out
