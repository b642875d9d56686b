"""Rank labels on the output of a task that runs on several nodes: each line starts with its node's rank,
right-aligned to the width of the highest ("0: ", " 3: " of 12 nodes), as `srun --label` writes a Slurm
job's log, so that a job's output on several nodes reads the same on every kind of place and tells which
node said what. A task on one node has none. WholeLines passes one of several streams that share an
output in whole lines, each labelled, so that one node's output never cuts into another's line. Pure: no
I/O. first_failure picks which of several ranks' failures is raised once all have run to their end.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from corral.errors import CorralError

LINE_LIMIT = 64 * 1024  # bytes of a line not yet ended that a sink keeps back; past that, they pass as they are


def rank_label(rank: int, count: int) -> bytes:
    """The label of `rank`'s lines among `count` nodes; none on one node."""
    return f"{rank:>{len(str(count - 1))}}: ".encode() if count > 1 else b""


def labelled(label: bytes, lines: bytes) -> bytes:
    """`lines` (whole lines, each ending with a newline but maybe the last) with `label` before each. A
    last line with no newline is given one, as srun ends an unfinished line when its node's output ends;
    a progress bar's update (ending with a carriage return) becomes a line of its own, since several
    nodes' bars cannot share one line of a terminal."""
    if not label or not lines:
        return lines
    parts = lines.split(b"\n")
    if parts[-1] == b"":
        parts.pop()
    return b"".join(label + part.removeprefix(b"\r").removesuffix(b"\r") + b"\n"
                    for part in parts if not part or part.strip(b"\r"))


def whole_lines_end(data: bytes) -> int:
    """Where the whole lines of `data` end: after its last newline or carriage return (a progress bar's
    updates end with one), or at its end when what follows is longer than LINE_LIMIT (output with no
    line ends, which would otherwise be kept back, and grow, until the stream ends)."""
    end = max(data.rfind(b"\n"), data.rfind(b"\r")) + 1
    return len(data) if len(data) - end > LINE_LIMIT else end


class WholeLines:
    """An output sink for one of several streams that share `on_output`: it passes whole lines only
    (whole_lines_end), each after `label`; a part of a line waits for its end, or for `flush`
    once the stream is over."""

    def __init__(self, on_output: Callable[[bytes], None], label: bytes = b"") -> None:
        self.on_output, self.label, self.partial = on_output, label, b""

    def __call__(self, chunk: bytes) -> None:
        data = self.partial + chunk
        end = whole_lines_end(data)
        if end:
            self.on_output(labelled(self.label, data[:end]))
        self.partial = data[end:]

    def flush(self) -> None:
        """Pass on what is left (a last line with no newline: given one where labelled)."""
        if self.partial:
            self.on_output(labelled(self.label, self.partial))
            self.partial = b""


def first_failure(results: Sequence[object]) -> BaseException | None:
    """The first exception among gather(..., return_exceptions=True)'s results, for a caller that let
    every rank (a machine's, a pod's) run to its end (one unreachable machine must not hide the others'
    output, nor leave them streaming for no one); a bug's exception (not a CorralError) before any
    CorralError."""
    failures = [r for r in results if isinstance(r, BaseException)]
    return next((f for f in failures if not isinstance(f, CorralError)), failures[0] if failures else None)
