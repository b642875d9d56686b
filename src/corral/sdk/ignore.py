"""Which of a workdir's files are sent: what git would leave out of it is left out.

The rules are git's, read from each `.gitignore` (for its own folder; a deeper file's over its
parent's; within a file the last line that matches wins; `!` takes a path back; a pattern with a slash
before its end is anchored to the file's folder; `dir/` is a folder only) and `.git/info/exclude` at the
root, or from `.corralignore` at the root instead of all of them (the same syntax, for the whole
tree: SkyPilot's `.skyignore` plays that part). A folder left out is not entered, so nothing under it
can be taken back, as in git. The matching is pathspec's `GitIgnoreSpec`, imported only for a workdir
that has such a file.

Corral used rsync's `--filter='dir-merge,- .gitignore'`, as SkyPilot does (skypilot#8812, #5492,
#3298), which reads every line as one more exclude: after `*.txt`, `!keep.txt` left keep.txt out as
well, and `data/*` left out every `…/data/*` in the tree, where git leaves out only the root's.

Cost: one walk of the folder, which skips what is left out (a `.venv/` listed in `.gitignore` is not
walked), and one match per file and folder against the rules above it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

IGNORE_FILE = ".corralignore"
GIT_IGNORE = ".gitignore"


def sent_entries(folder: Path, *, rules: bool = True) -> Iterator[os.DirEntry[str]]:
    """Every file, link and folder under `folder` that is sent, depth first in name order (as tar adds a
    folder); without `rules`, all of them. Raises OSError for a folder that cannot be listed."""
    own = folder / IGNORE_FILE
    stack: list[tuple[str, Any]] = []  # (folder relative to the root, with a trailing slash; its rules)
    if rules and own.is_file():
        stack.append(("", _spec(own.read_text(errors="replace").splitlines())))
        per_folder = False
    else:
        per_folder = rules
        exclude = folder / ".git" / "info" / "exclude"
        if per_folder and exclude.is_file():
            stack.append(("", _spec(exclude.read_text(errors="replace").splitlines())))
    yield from _walk(folder, "", stack, per_folder)


def _walk(folder: Path, prefix: str, stack: list[tuple[str, Any]], per_folder: bool) -> Iterator[os.DirEntry[str]]:
    with os.scandir(folder) as listing:
        entries = sorted(listing, key=lambda e: e.name)
    if per_folder and any(e.name == GIT_IGNORE and e.is_file() for e in entries):
        lines = (folder / GIT_IGNORE).read_text(errors="replace").splitlines()
        stack = [*stack, (prefix, _spec(lines))]
    for entry in entries:
        is_folder = entry.is_dir(follow_symlinks=False)
        relative = prefix + entry.name + ("/" if is_folder else "")
        if _ignored(relative, stack):
            continue
        yield entry
        if is_folder:
            yield from _walk(Path(entry.path), relative, stack, per_folder)


def _ignored(relative: str, stack: list[tuple[str, Any]]) -> bool:
    """The deepest rules that say anything about the path decide; a folder's path ends with `/`."""
    for base, spec in reversed(stack):
        verdict = spec.check_file(relative[len(base):]).include
        if verdict is not None:
            return bool(verdict)
    return False


def _spec(lines: list[str]) -> Any:
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(lines)
