"""sdk/ignore.py: a workdir leaves out what git would, checked against git itself."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from corral.sdk.ignore import sent_entries

FILES = ["a.txt", "keep.txt", "x.py", "data/a.csv", "data/README.md", "sub/a.txt", "sub/keep.txt", "sub/data/b.csv",
         "build/out.o", "sub/build/o.o", "logs/x.log", ".env", "sub/deep/keep.txt"]
LINES = ["*.txt", "!keep.txt", "data/", "data/*", "!data/README.md", "/sub", "build/", "**/data", "*.log",
         "!*.log", "sub/*.txt", "/a.txt", "# a comment", "", "!sub/", "sub/", "deep", "*.csv", "!/sub/data/b.csv",
         ".env", "x.py/"]


def sent(folder: Path) -> set[str]:
    return {Path(e.path).relative_to(folder).as_posix() for e in sent_entries(folder) if e.is_file()
            and not Path(e.path).relative_to(folder).as_posix().startswith(".git/")}


def gits_view(folder: Path) -> set[str]:
    """The files `git add -A` would take: untracked and not ignored (no global excludes)."""
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    listed = subprocess.run(["git", "-c", "core.excludesFile=/dev/null", "-C", str(folder), "ls-files", "-z",
                             "--others", "--exclude-standard"], check=True, capture_output=True, text=True).stdout
    return set(filter(None, listed.split("\0")))


def tree(folder: Path, files: list[str], ignores: dict[str, list[str]]) -> Path:
    for name in files:
        (folder / name).parent.mkdir(parents=True, exist_ok=True)
        (folder / name).write_text(name)
    for where, lines in ignores.items():
        (folder / where).mkdir(parents=True, exist_ok=True)
        (folder / where / ".gitignore").write_text("\n".join(lines) + "\n")
    return folder


@pytest.mark.parametrize("root, sub, left_out", [
    (["*.txt", "!keep.txt"], [], {"a.txt", "sub/a.txt"}),  # rsync had left keep.txt out too
    (["data/*", "!data/README.md"], [], {"data/a.csv"}),  # rsync: sub/data/b.csv too (not anchored in git)
    (["sub/*.txt"], [], {"sub/a.txt", "sub/keep.txt"}),
    (["*.txt"], ["!a.txt"], {"a.txt", "keep.txt", "sub/keep.txt", "sub/deep/keep.txt"}),  # the deeper file wins
    (["/sub"], ["!a.txt"], {f for f in [*FILES, "sub/.gitignore"] if f.startswith("sub/")}),  # none comes back
    # `!sub/` takes back the folder sub, not sub/data under it (pathspec's own check let it; CI's hypothesis)
    (["data/", "!sub/"], ["!data/README.md"], {"data/a.csv", "data/README.md", "sub/data/b.csv"}),
])
def test_what_is_left_out_is_what_git_leaves_out(tmp_path, root, sub, left_out):
    folder = tree(tmp_path / "w", FILES, {".": root, **({"sub": sub} if sub else {})})
    ignore_files = {".gitignore"} | ({"sub/.gitignore"} if sub else set())
    assert sent(folder) == (set(FILES) | ignore_files) - left_out
    assert sent(folder) == gits_view(folder)


def test_git_info_exclude_counts_and_corralignore_replaces_every_gitignore(tmp_path):
    folder = tree(tmp_path / "w", FILES, {".": ["*.csv"]})
    (folder / ".git" / "info").mkdir(parents=True)
    (folder / ".git" / "info" / "exclude").write_text("*.log\n")
    assert "logs/x.log" not in sent(folder) and "data/a.csv" not in sent(folder)
    (folder / ".corralignore").write_text("build/\n")
    assert {"logs/x.log", "data/a.csv"} <= sent(folder) and "build/out.o" not in sent(folder)
    assert "sub/build/o.o" not in sent(folder)  # `build/` without a slash before its end: at any depth


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(root=st.lists(st.sampled_from(LINES), max_size=6), sub=st.lists(st.sampled_from(LINES), max_size=3),
       files=st.sets(st.sampled_from(FILES), min_size=1))
def test_any_ignore_files_leave_out_what_git_does(tmp_path_factory, root, sub, files):
    folder = tree(tmp_path_factory.mktemp("w"), sorted(files), {".": root, "sub": sub})
    assert sent(folder) == gits_view(folder)


def test_a_file_git_tracks_is_sent_though_a_rule_ignores_it(tmp_path):
    """`git add -f`: the file is part of the repository, ignored or not (in an ignored folder too)."""
    folder = tree(tmp_path / "w", FILES, {".": ["*.csv", "build/", "logs"]})
    assert "data/a.csv" not in sent(folder)  # not a repository yet: the rules alone
    subprocess.run(["git", "init", "-q", str(folder)], check=True)
    subprocess.run(["git", "-C", str(folder), "add", "-f", "data/a.csv", "build/out.o", ".gitignore"], check=True)
    listed = subprocess.run(["git", "-c", "core.excludesFile=/dev/null", "-C", str(folder), "ls-files", "-z",
                             "--cached", "--others", "--exclude-standard"], check=True, capture_output=True,
                            text=True).stdout
    assert sent(folder) == set(filter(None, listed.split("\0")))  # what a clone plus `git add -A` would hold
    assert {"data/a.csv", "build/out.o"} <= sent(folder) and "sub/data/b.csv" not in sent(folder)
    assert "logs/x.log" not in sent(folder) and "sub/build/o.o" not in sent(folder)
