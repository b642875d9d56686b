"""Rank labels on the output of a task that runs on several nodes: each line starts with its node's rank,
right-aligned to the width of the highest ("0: ", " 3: " of 12 nodes), as `srun --label` writes a Slurm
job's log, so that a job's output on several nodes reads the same on every kind of place and tells which
node said what. A task on one node has none. Pure: no I/O.
"""

from __future__ import annotations


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
