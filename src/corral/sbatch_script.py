"""An sbatch job script and command line, read the way `sbatch` reads them (stdlib only: the thin CLI
splits its arguments with it, the server reads the script with it).

- `#SBATCH` directives count from the top of the script (after the `#!` line) up to the first line
  that is neither blank nor a comment; each is tokenised as sbatch does (quotes, backslash escapes, an
  unquoted `#` ends the line's options).
- Options are parsed like getopt_long: `--name=value`, `--name value`, `-Xvalue`, `-X value`, a long
  name abbreviated to any unique prefix, and options whose argument is optional take one only after `=`
  (long) or attached (short).
- Command-line options win over directives; `effective()` merges the two that way.

Every option keeps where it was written (line, character span), so that a rewrite can replace exactly
that option and leave every other byte of the script as it was.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from typing import NamedTuple

from corral.errors import TaskError

DIRECTIVE = "#SBATCH"
MAX_SCRIPT_BYTES = 1024 * 1024  # sbatch's own limit is 4 MiB; a job script this size is a mistake

REQUIRED, NONE, OPTIONAL = "required", "none", "optional"

# A Corral job in a --dependency (afterok:c-0dc34e09a55c), optionally as `corral sbatch --parsable` prints
# it (c-0dc34e09a55c;alpine, as sbatch -M prints jobid;cluster): group 1 the id, group 2 the cluster.
CORRAL_JOB_REF = re.compile(r"(?<![A-Za-z0-9_-])(c-[0-9a-f]{4,32})(?:;([A-Za-z0-9][A-Za-z0-9._-]*))?"
                            r"(?![A-Za-z0-9_-])", re.ASCII)

# sbatch's options (man sbatch, Slurm 22.05–24.11): long name -> (short letter or "", argument).
OPTIONS: dict[str, tuple[str, str]] = {
    "account": ("A", REQUIRED), "acctg-freq": ("", REQUIRED), "array": ("a", REQUIRED),
    "batch": ("", REQUIRED), "bb": ("", REQUIRED), "bbf": ("", REQUIRED), "begin": ("b", REQUIRED),
    "chdir": ("D", REQUIRED), "cluster-constraint": ("", REQUIRED), "clusters": ("M", REQUIRED),
    "comment": ("", REQUIRED), "constraint": ("C", REQUIRED), "container": ("", REQUIRED),
    "container-id": ("", REQUIRED), "contiguous": ("", NONE), "core-spec": ("S", REQUIRED),
    "cores-per-socket": ("", REQUIRED), "cpu-freq": ("", REQUIRED), "cpus-per-gpu": ("", REQUIRED),
    "cpus-per-task": ("c", REQUIRED), "deadline": ("", REQUIRED), "delay-boot": ("", REQUIRED),
    "dependency": ("d", REQUIRED), "distribution": ("m", REQUIRED), "error": ("e", REQUIRED),
    "exclude": ("x", REQUIRED), "exclusive": ("", OPTIONAL), "export": ("", REQUIRED),
    "export-file": ("", REQUIRED), "extra": ("", REQUIRED), "extra-node-info": ("B", REQUIRED),
    "get-user-env": ("", OPTIONAL), "gid": ("", REQUIRED), "gpu-bind": ("", REQUIRED),
    "gpu-freq": ("", REQUIRED), "gpus": ("G", REQUIRED), "gpus-per-node": ("", REQUIRED),
    "gpus-per-socket": ("", REQUIRED), "gpus-per-task": ("", REQUIRED), "gres": ("", REQUIRED),
    "gres-flags": ("", REQUIRED), "help": ("h", NONE), "hint": ("", REQUIRED), "hold": ("H", NONE),
    "ignore-pbs": ("", NONE), "immediate": ("I", OPTIONAL), "input": ("i", REQUIRED),
    "job-name": ("J", REQUIRED), "kill-on-invalid-dep": ("", REQUIRED), "licenses": ("L", REQUIRED),
    "mail-type": ("", REQUIRED), "mail-user": ("", REQUIRED), "mcs-label": ("", REQUIRED),
    "mem": ("", REQUIRED), "mem-bind": ("", REQUIRED), "mem-per-cpu": ("", REQUIRED),
    "mem-per-gpu": ("", REQUIRED), "mincpus": ("", REQUIRED), "network": ("", REQUIRED),
    "nice": ("", OPTIONAL), "no-kill": ("k", OPTIONAL), "no-requeue": ("", NONE),
    "nodefile": ("F", REQUIRED), "nodelist": ("w", REQUIRED), "nodes": ("N", REQUIRED),
    "ntasks": ("n", REQUIRED), "ntasks-per-core": ("", REQUIRED), "ntasks-per-gpu": ("", REQUIRED),
    "ntasks-per-node": ("", REQUIRED), "ntasks-per-socket": ("", REQUIRED), "oom-kill-step": ("", OPTIONAL),
    "open-mode": ("", REQUIRED), "output": ("o", REQUIRED), "overcommit": ("O", NONE),
    "oversubscribe": ("s", NONE), "parsable": ("", NONE), "partition": ("p", REQUIRED),
    "power": ("", REQUIRED), "prefer": ("", REQUIRED), "priority": ("", REQUIRED),
    "profile": ("", REQUIRED), "propagate": ("", OPTIONAL), "qos": ("q", REQUIRED), "quiet": ("Q", NONE),
    "reboot": ("", NONE), "requeue": ("", NONE), "reservation": ("", REQUIRED),
    "resv-ports": ("", OPTIONAL), "segment": ("", REQUIRED), "signal": ("", REQUIRED),
    "sockets-per-node": ("", REQUIRED), "spread-job": ("", NONE), "switches": ("", REQUIRED),
    "test-only": ("", NONE), "thread-spec": ("", REQUIRED), "threads-per-core": ("", REQUIRED),
    "time": ("t", REQUIRED), "time-min": ("", REQUIRED), "tmp": ("", REQUIRED),
    "tres-bind": ("", REQUIRED), "tres-per-task": ("", REQUIRED), "uid": ("", REQUIRED),
    "usage": ("u", NONE), "use-min-nodes": ("", NONE), "verbose": ("v", NONE), "version": ("V", NONE),
    "wait": ("W", NONE), "wait-all-nodes": ("", REQUIRED), "wckey": ("", REQUIRED), "wrap": ("", REQUIRED),
}
SHORT = {short: long for long, (short, _) in OPTIONS.items() if short}


class ScriptError(TaskError):
    """A job script or sbatch command line Corral cannot read (its message says where)."""


@dataclass(frozen=True)
class Option:
    """One option as written: `name` is sbatch's long name, whatever spelling was used."""

    name: str
    value: str | None
    spelling: str  # as written: "-p", "--partition", "--part"
    line: int | None = None  # 0-based line of the script; None for the command line
    span: tuple[int, int] | None = None  # characters of the line the option (and its value) takes
    component: int = 0  # of a heterogeneous job (`#SBATCH hetjob` separates them)


@dataclass(frozen=True)
class Script:
    """A job script's text and the options its `#SBATCH` lines give."""

    text: str
    directives: tuple[Option, ...]
    separators: tuple[int, ...] = ()  # lines of `#SBATCH hetjob`, one per component after the first

    @property
    def lines(self) -> list[str]:
        return self.text.splitlines(keepends=True)

    @property
    def components(self) -> int:
        return len(self.separators) + 1

    def component_directives(self, component: int) -> list[Option]:
        return [o for o in self.directives if o.component == component]

    def component_end(self, component: int) -> int:
        """The line after which a new directive of this component goes: its last directive's line, or
        the line that opens it (the `#!` line, or its `hetjob` separator)."""
        lines = [o.line for o in self.component_directives(component) if o.line is not None]
        return max(lines, default=0 if component == 0 else self.separators[component - 1])


def is_batch_script(text: str) -> bool:
    """A job script as `corral launch` recognises one: a `#!` line and at least one `#SBATCH` directive."""
    if not text.startswith("#!"):
        return False
    try:
        return bool(read_script(text).directives)
    except ScriptError:
        return True  # a script with a bad directive is still a script: reading it says what is wrong


def read_script(text: str, source: str = "script") -> Script:
    """The script's directives, in order, up to its first command."""
    if len(text.encode("utf-8", errors="replace")) > MAX_SCRIPT_BYTES:
        raise ScriptError(f"{source}: larger than {MAX_SCRIPT_BYTES // 1024} KiB; not a job script")
    if "\x00" in text:
        raise ScriptError(f"{source}: holds a NUL byte; not a job script")
    if not text.startswith("#!"):
        raise ScriptError(f"{source}: a job script starts with a '#!' line (e.g. #!/bin/bash), as sbatch requires")
    directives: list[Option] = []
    separators: list[int] = []
    for number, line in enumerate(text.splitlines()):
        if number == 0:
            continue
        stripped = line.strip()
        if stripped and not stripped.startswith("#"):
            break  # sbatch reads no directive after the first command
        if not (line.startswith(DIRECTIVE) and (len(line) == len(DIRECTIVE) or line[len(DIRECTIVE)].isspace())):
            continue
        tokens = _tokens(line, len(DIRECTIVE), f"{source}:{number + 1}")
        if [t[0] for t in tokens] in (["hetjob"], ["packjob"]):
            separators.append(number)
            continue
        directives += [replace(o, component=len(separators))
                       for o in parse_options(tokens, f"{source}:{number + 1}", line=number)]
    return Script(text, tuple(directives), tuple(separators))


def _tokens(line: str, start: int, where: str) -> list[tuple[str, int, int]]:
    """(word, start, end) for each word of a directive line from `start`, as sbatch splits them."""
    out: list[tuple[str, int, int]] = []
    i, n = start, len(line)
    while i < n:
        while i < n and line[i] in " \t":
            i += 1
        if i >= n or line[i] == "#":
            break
        begin, word, quote = i, [], None
        while i < n and (quote or line[i] not in " \t"):
            char = line[i]
            if quote:
                if char == quote:
                    quote = None
                else:
                    word.append(char)
            elif char in "\"'":
                quote = char
            elif char == "\\" and i + 1 < n:
                i += 1
                word.append(line[i])
            elif char == "#":
                break
            else:
                word.append(char)
            i += 1
        if quote:
            raise ScriptError(f"{where}: an unclosed {quote} quote in the #SBATCH line")
        out.append(("".join(word), begin, i))
        if i < n and line[i] == "#":
            break
    return out


def _long_name(written: str, where: str) -> str:
    if written in OPTIONS:
        return written
    matches = [name for name in OPTIONS if name.startswith(written)]
    if len(matches) == 1:
        return matches[0]
    if matches:
        raise ScriptError(f"{where}: --{written} is ambiguous ({', '.join('--' + m for m in sorted(matches))})")
    raise ScriptError(f"{where}: --{written} is not an sbatch option (man sbatch lists them)")


def parse_options(tokens: Sequence[tuple[str, int, int]], where: str, line: int | None = None) -> list[Option]:
    """Options from words, as getopt_long reads sbatch's; a word that is not an option is an error."""
    out: list[Option] = []
    i = 0
    while i < len(tokens):
        word, begin, end = tokens[i]
        if word.startswith("--") and len(word) > 2:
            written, eq, value = word[2:].partition("=")
            name = _long_name(written, where)
            argument = OPTIONS[name][1]
            if argument == NONE and eq:
                raise ScriptError(f"{where}: --{name} takes no value")
            if argument == REQUIRED and not eq:
                if i + 1 >= len(tokens):
                    raise ScriptError(f"{where}: --{name} needs a value")
                i += 1
                value, end = tokens[i][0], tokens[i][2]
            out.append(Option(name, value if (eq or argument == REQUIRED) else None, "--" + written, line,
                              (begin, end)))
        elif word.startswith("-") and len(word) > 1:
            letters = word[1:]
            while letters:
                letter, letters = letters[0], letters[1:]
                if letter not in SHORT:
                    raise ScriptError(f"{where}: -{letter} is not an sbatch option (man sbatch lists them)")
                name = SHORT[letter]
                argument = OPTIONS[name][1]
                if argument == NONE:
                    out.append(Option(name, None, "-" + letter, line, (begin, end)))
                    continue
                if letters or argument == OPTIONAL:
                    out.append(Option(name, letters or None, "-" + letter, line, (begin, end)))
                    break
                if i + 1 >= len(tokens):
                    raise ScriptError(f"{where}: -{letter} needs a value")
                i += 1
                out.append(Option(name, tokens[i][0], "-" + letter, line, (begin, tokens[i][2])))
        else:
            raise ScriptError(f"{where}: {word!r} is not an option; a #SBATCH line holds options only")
        i += 1
    return out


def _short_wants_next(word: str) -> bool:
    """Whether a cluster of short options (`-HN`) ends with one whose value is the next word, as getopt
    reads it: letters without a value, then at most one that takes the rest of the word or the next."""
    for at, letter in enumerate(word[1:], start=1):
        name = SHORT.get(letter)
        if name is None:
            raise ScriptError(f"command line: -{letter} is not an sbatch option (man sbatch lists them)")
        if OPTIONS[name][1] != NONE:
            return OPTIONS[name][1] == REQUIRED and at == len(word) - 1
    return False


class CommandLine(NamedTuple):
    """`sbatch [OPTIONS] script [ARGS]` split: the options (but `--wrap`, `--wait` and `--test-only`, which
    the client does itself), their words as given, the script and its arguments, the command `--wrap`
    gives instead of a script, whether to wait for the job's end (`-W/--wait`), and whether it is a dry
    run."""

    options: list[Option]
    words: list[str]
    script: str | None
    args: list[str]
    wrap: str | None = None
    wait: bool = False
    test_only: bool = False  # `--test-only`: a dry run (the plan, with Slurm's predicted starts)


CLIENT_OPTIONS = ("wrap", "wait", "test-only")  # done by the client, as sbatch does them: never sent to Slurm


def split_command_line(argv: Sequence[str]) -> CommandLine:
    """`sbatch [OPTIONS] script [ARGS]`, or `sbatch [OPTIONS] --wrap CMD`. Options end at the first word
    that is not one (or after `--`)."""
    groups: list[list[str]] = []  # each option's words: one, or two when its value is the next word
    i = 0
    while i < len(argv):
        word = argv[i]
        if word == "--":
            i += 1
            break
        if word == ":":
            raise ScriptError("command line: ':' separates the components of a heterogeneous job; write them in "
                              "the script instead (#SBATCH hetjob between their directives)")
        if not word.startswith("-") or word == "-":
            break
        groups.append([word])
        if word.startswith("--") and "=" not in word:
            name = _long_name(word[2:], "command line")
            if OPTIONS[name][1] == REQUIRED and i + 1 < len(argv):
                i += 1
                groups[-1].append(argv[i])
        elif not word.startswith("--") and _short_wants_next(word) and i + 1 < len(argv):
            i += 1
            groups[-1].append(argv[i])
        i += 1
    options: list[Option] = []
    words: list[str] = []
    client: dict[str, str | None] = {}
    for group in groups:  # a group is one long option, or a cluster of short ones (-WHN2)
        parsed = [Option(o.name, o.value, o.spelling) for o in parse_options([(w, 0, 0) for w in group],
                                                                              "command line")]
        kept = [o for o in parsed if o.name not in CLIENT_OPTIONS]
        client.update((o.name, o.value) for o in parsed if o.name in CLIENT_OPTIONS)
        options += kept
        # a cluster that held -W is written again without it (its other letters are short options too)
        words += group if len(kept) == len(parsed) else [o.spelling + (o.value or "") for o in kept]
    script = argv[i] if i < len(argv) else None
    wrap = client.get("wrap")
    if wrap is not None and script is not None:
        raise ScriptError(f"command line: --wrap is the job's script, so {script!r} and what follows cannot be "
                          "given too (sbatch: 'Script arguments not permitted with --wrap option')")
    return CommandLine(options, words, script, list(argv[i + 1:]) if script is not None else [], wrap,
                       "wait" in client, "test-only" in client)


def wrap_script(command: str) -> str:
    """The script `sbatch --wrap COMMAND` writes: COMMAND in a plain sh script, byte for byte as sbatch's."""
    return f"#!/bin/sh\n# This script was created by sbatch --wrap.\n\n{command}\n"


def effective(command_line: Iterable[Option], directives: Iterable[Option], component: int = 0) -> dict[str, Option]:
    """The option that counts for each name in one component of the job: the command line's (which
    speaks for the first component) over the script's, the last of each."""
    out: dict[str, Option] = {}
    for option in directives:
        if option.component != component:
            continue
        out[option.name] = option
    if component:
        return out
    for option in command_line:
        out[option.name] = option
    return out


_ARRAY_PART = re.compile(r"^(\d+)(?:-(\d+)(?::(\d+))?)?\Z", re.ASCII)
MAX_ARRAY_TASKS = 10_000


def array_indices(spec: str, where: str = "--array") -> tuple[tuple[int, ...], str | None]:
    """The indices an `--array` spec names (`0-15`, `1,3,5-9:2`, `0-99%10`), in order, and its
    `%` throttle (None without one)."""
    body, _, throttle = spec.partition("%")
    if throttle and not throttle.isdigit():
        raise ScriptError(f"{where}={spec}: the part after % must be a number of tasks at once")
    indices: list[int] = []
    for part in body.split(","):
        match = _ARRAY_PART.match(part.strip())
        if not match:
            raise ScriptError(f"{where}={spec}: {part!r} is not an index, a range (0-15) or a stepped range (0-15:4)")
        first = int(match.group(1))
        last = int(match.group(2)) if match.group(2) is not None else first
        step = int(match.group(3)) if match.group(3) is not None else 1
        if last < first or step < 1:
            raise ScriptError(f"{where}={spec}: {part!r} is an empty range")
        if (last - first) // step + 1 + len(indices) > MAX_ARRAY_TASKS:
            raise ScriptError(f"{where}={spec}: more than {MAX_ARRAY_TASKS:,} tasks (Slurm's default MaxJobCount "
                              "holds 10,000 jobs per cluster)")
        indices += range(first, last + 1, step)
    ordered = tuple(sorted(set(indices)))
    return ordered, throttle or None


MAX_HOSTS = 100_000
_HOST_RANGE = re.compile(r"^(\d+)(?:-(\d+))?\Z", re.ASCII)


def expand_hostlist(text: str, where: str = "--nodelist") -> list[str]:
    """The node names a Slurm hostlist names (`a1,b[1-3,07-08],rack[1-2]-n[1-2]`), in order: a bracket
    holds numbers and ranges, a range keeps its first bound's zero padding, several brackets multiply."""
    names: list[str] = []
    for item in _top_level_split(text, where):
        names += _expand_host(item, where)
        if len(names) > MAX_HOSTS:
            raise ScriptError(f"{where}={text}: more than {MAX_HOSTS:,} nodes")
    return list(dict.fromkeys(names))


def _top_level_split(text: str, where: str) -> list[str]:
    items, depth, start = [], 0, 0
    for at, char in enumerate(text):
        depth += {"[": 1, "]": -1}.get(char, 0)
        if depth not in (0, 1):
            raise ScriptError(f"{where}={text}: unbalanced or nested brackets")
        if char == "," and depth == 0:
            items.append(text[start:at])
            start = at + 1
    if depth:
        raise ScriptError(f"{where}={text}: a '[' is not closed")
    items.append(text[start:])
    if any(not item.strip() for item in items):
        raise ScriptError(f"{where}={text}: an empty node name")
    return [item.strip() for item in items]


def _expand_host(item: str, where: str) -> list[str]:
    opening = item.find("[")
    if opening < 0:
        return [item]
    closing = item.index("]", opening)
    numbers: list[str] = []
    for part in item[opening + 1:closing].split(","):
        match = _HOST_RANGE.match(part.strip())
        if not match:
            raise ScriptError(f"{where}={item}: {part!r} is not a number or a range (1-4, 01-16)")
        first, last = match.group(1), match.group(2) or match.group(1)
        if int(last) < int(first) or int(last) - int(first) > MAX_HOSTS:
            raise ScriptError(f"{where}={item}: {part!r} is not a range of at most {MAX_HOSTS:,} nodes")
        numbers += [str(n).zfill(len(first)) for n in range(int(first), int(last) + 1)]
    head, tails = item[:opening], _expand_host(item[closing + 1:], where)
    if len(numbers) * len(tails) > MAX_HOSTS:
        raise ScriptError(f"{where}={item}: more than {MAX_HOSTS:,} nodes")
    return [head + number + tail for number in numbers for tail in tails]


def array_spec(indices: Sequence[int], throttle: str | None) -> str:
    """An `--array` value for these indices (ranges where they run on), with the throttle."""
    parts: list[str] = []
    run: list[int] = []
    for index in sorted(indices):
        if run and index == run[-1] + 1:
            run.append(index)
            continue
        if run:
            parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
        run = [index]
    if run:
        parts.append(f"{run[0]}-{run[-1]}" if len(run) > 1 else str(run[0]))
    return ",".join(parts) + (f"%{throttle}" if throttle else "")
