"""Which of a workdir's files are sent: what git would leave out of it is left out.

The rules are git's, read from each `.gitignore` (for its own folder; a deeper file's over its
parent's; within a file the last line that matches wins; `!` takes a path back; a pattern with a slash
before its end is anchored to the file's folder; `dir/` is a folder only) and `.git/info/exclude` at the
root, or from `.corralignore` at the root instead of all of them (the same syntax, for the whole
tree: SkyPilot's `.skyignore` plays that part). A folder left out is not entered, so nothing under it
can be taken back, as in git. The matching is pathspec's `GitIgnoreSpec`, imported only for a workdir
that has such a file. In a git repository (a workdir with `.git`), a file git tracks is sent even when
a rule ignores it (`git add -f`), as it is part of the repository: `git ls-files` says which, once.

Corral used rsync's `--filter='dir-merge,- .gitignore'`, as SkyPilot does (skypilot#8812, #5492,
#3298), which reads every line as one more exclude: after `*.txt`, `!keep.txt` left keep.txt out as
well, and `data/*` left out every `…/data/*` in the tree, where git leaves out only the root's.

Cost: one walk of the folder, which skips what is left out (a `.venv/` listed in `.gitignore` is not
walked), and one match per file and folder against the rules above it; in a git repository where
something is ignored, one `git ls-files` (a few ms).
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
    tracked = _Tracked(None)
    if rules and own.is_file():
        stack.append(("", _spec(own.read_text(errors="replace").splitlines())))
        per_folder = False
    else:
        per_folder = rules
        exclude = folder / ".git" / "info" / "exclude"
        if per_folder and exclude.is_file():
            stack.append(("", _spec(exclude.read_text(errors="replace").splitlines())))
        if per_folder and (folder / ".git").exists():
            tracked = _Tracked(folder)
    yield from _walk(folder, "", stack, per_folder, tracked)


class _Tracked:
    """The files git tracks although its rules ignore them (`git add -f`): they are part of the
    repository, so they are sent. Asked of git once, when the walk first meets an ignored path."""

    def __init__(self, root: Path | None):
        self.root = root
        self._files: set[str] | None = None
        self._folders: set[str] = set()

    def holds(self, relative: str) -> bool:
        """`relative` is such a file, or a folder (ending in /) with one inside."""
        if self.root is None:
            return False
        if self._files is None:
            self._files = _tracked_but_ignored(self.root)
            self._folders = {name[:at + 1] for name in self._files for at, c in enumerate(name) if c == "/"}
        return relative in self._files or relative in self._folders


def _tracked_but_ignored(root: Path) -> set[str]:
    import subprocess

    try:
        listed = subprocess.run(["git", "-C", str(root), "ls-files", "-z", "--cached", "--ignored",
                                 "--exclude-standard"], capture_output=True, timeout=30, check=True).stdout
    except (OSError, subprocess.SubprocessError):  # no git, not a repository it will read: its rules alone
        return set()
    return {name for name in listed.decode(errors="surrogateescape").split("\0") if name}


def _walk(folder: Path, prefix: str, stack: list[tuple[str, Any]], per_folder: bool, tracked: _Tracked,
          only_tracked: bool = False) -> Iterator[os.DirEntry[str]]:
    """`only_tracked`: a folder git ignores, entered for the tracked files in it (and only those)."""
    with os.scandir(folder) as listing:
        entries = sorted(listing, key=lambda e: e.name)
    if per_folder and not only_tracked and any(e.name == GIT_IGNORE and e.is_file() for e in entries):
        lines = (folder / GIT_IGNORE).read_text(errors="replace").splitlines()
        stack = [*stack, (prefix, _spec(lines))]
    for entry in entries:
        is_folder = entry.is_dir(follow_symlinks=False)
        relative = prefix + entry.name + ("/" if is_folder else "")
        ignored = only_tracked or _ignored(relative, stack)
        if ignored and not tracked.holds(relative):
            continue
        yield entry
        if is_folder:
            yield from _walk(Path(entry.path), relative, stack, per_folder, tracked, ignored)


def _ignored(relative: str, stack: list[tuple[str, Any]]) -> bool:
    """The deepest rules that say anything about the path decide; a folder's path ends with `/`."""
    for base, spec in reversed(stack):
        verdict = _verdict(spec, relative[len(base):])
        if verdict is not None:
            return verdict
    return False


def _verdict(spec: Any, path: str) -> bool | None:
    """Git's: the last pattern that matches the path itself decides (True: ignored). pathspec's own check
    lets a folder pattern match what is under the folder too, so `!sub/` took back `sub/data/` that
    `data/` ignores; here a folder's contents are never asked about once it is ignored (the walk does
    not enter it), as in git."""
    for pattern in reversed(spec.patterns):
        if pattern.include is None or pattern.regex is None:
            continue
        match = pattern.regex.match(path)
        if match is not None and match.end() == len(path):
            return bool(pattern.include)
    return None


def _spec(lines: list[str]) -> Any:
    import pathspec

    return pathspec.GitIgnoreSpec.from_lines(lines)
