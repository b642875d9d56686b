"""Times for people (timefmt.py): pure."""

from __future__ import annotations

from corral.timefmt import duration, slurm_time


def test_slurm_time_is_written_as_slurm_writes_a_time_left():
    assert [slurm_time(s) for s in (0, 59, 4 * 3600 + 309, 86400 + 61, 2 * 86400)] == [
        "0:00:00", "0:00:59", "4:05:09", "1-00:01:01", "2-00:00:00"]
    assert slurm_time(-5) == "0:00:00"  # a deadline just passed


def test_duration_is_compact():
    assert [duration(s) for s in (45, 720, 3 * 3600 + 300)] == ["45s", "12m", "3h05m"]
