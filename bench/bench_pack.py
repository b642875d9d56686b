"""Packing a workdir for the server: what `corral launch` does before it sends a task's files.

Run anywhere (no testbed):  python bench/bench_pack.py [--sources N] [--ignored N]
A workdir of N small source files beside a `.venv/` of many more that its `.gitignore` leaves out,
as a Python project has. Times `corral.sdk.files.pack` (walk, ignore rules, tar, SHA-256; median of
runs) against GNU tar told to honour the same `.gitignore` (`tar --exclude-vcs-ignores`), the raw way
to pack it, piped to `sha256sum`.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from bench.common import median_of, print_table  # noqa: E402


def workdir(root: Path, sources: int, ignored: int) -> Path:
    folder = root / "project"
    (folder / "src").mkdir(parents=True)
    for i in range(sources):
        (folder / "src" / f"module{i}.py").write_text(f"VALUE = {i}\n" * 20)
    per_folder = 100
    for i in range(ignored):
        package = folder / ".venv" / "lib" / f"package{i // per_folder}"
        package.mkdir(parents=True, exist_ok=True)
        (package / f"file{i % per_folder}.py").write_text("x = 1\n" * 30)
    (folder / ".gitignore").write_text(".venv/\n__pycache__/\n")
    return folder


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--sources", type=int, default=200)
    parser.add_argument("--ignored", type=int, default=20_000)
    parser.add_argument("--runs", type=int, default=7)
    args = parser.parse_args()
    from corral.sdk.files import pack

    with tempfile.TemporaryDirectory() as root:
        folder = workdir(Path(root), args.sources, args.ignored)

        def corral_pack() -> float:
            started = time.perf_counter()
            packed = pack(folder, workdir=True)
            elapsed = time.perf_counter() - started
            packed.archive.unlink()
            return elapsed

        def raw_tar() -> float:
            started = time.perf_counter()
            subprocess.run(f"tar -cf - --exclude-vcs-ignores -C {folder} . | sha256sum", shell=True, check=True,
                           stdout=subprocess.DEVNULL)
            return time.perf_counter() - started

        baseline = median_of(args.runs, raw_tar)
        plain = median_of(args.runs, corral_pack)
        # the same folder as a git repository with its sources committed: its .git is sent as well (as
        # SkyPilot sends it, for git commands in the job), and one `git ls-files` asks which ignored files
        # git tracks (sdk/ignore.py)
        commit = ["-c", "user.name=b", "-c", "user.email=b@b", "commit", "-qm", "b"]
        for command in (["init", "-q"], ["add", "."], commit):
            subprocess.run(["git", "-C", str(folder), *command], check=True, stdout=subprocess.DEVNULL)
        in_repo, repo_baseline = median_of(args.runs, corral_pack), median_of(args.runs, raw_tar)
        print_table(f"packing a workdir of {args.sources} files beside {args.ignored:,} that .gitignore leaves out "
                    f"(median of {args.runs})",
                    [("corral.sdk.files.pack (walk, git's ignore rules, tar, sha256)", plain, baseline, "-"),
                     ("the same as a git repository (its .git sent too, and one git ls-files)", in_repo,
                      repo_baseline, "-")])


if __name__ == "__main__":
    main()
