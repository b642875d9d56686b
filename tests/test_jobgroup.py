"""A job group's header (corral/jobgroup.py): which tasks are auxiliary and their termination delays."""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from corral.errors import TaskError
from corral.jobgroup import MAX_TERMINATION_DELAY, auxiliary_delays, parse_delay


@pytest.mark.parametrize("value, seconds", [("30s", 30.0), ("5m", 300.0), ("1h", 3600.0), ("90", 90.0), (45, 45.0),
                                            (2.5, 2.5), (" 2M ", 120.0), ("0", 0.0)])
def test_a_delay_is_seconds_or_a_duration(value, seconds):
    assert parse_delay(value, "d") == seconds


@pytest.mark.parametrize("value", ["soon", "", "-5s", "25h", True, None, [1], "nan", "inf", float("nan"), 10**9])
def test_anything_else_is_refused_with_what_to_give(value):
    with pytest.raises(TaskError, match="is not a delay: give seconds or a duration such as 30s"):
        parse_delay(value, "d")


def test_every_task_is_primary_unless_primary_tasks_says_otherwise():
    assert auxiliary_delays(["a", "b"], None, None) == [None, None]
    assert auxiliary_delays(["a", "b"], ["a"], None) == [None, 0.0]
    assert auxiliary_delays(["a", "b", "c"], ["a"], {"default": "1m", "c": 5}) == [None, 60.0, 5.0]
    assert auxiliary_delays(["a", "b"], None, "30s") == [None, None]  # nothing is auxiliary: nothing is stopped


@pytest.mark.parametrize("names, primary, delay, message", [
    (["a", None], None, None, "task 1 has no `name`"),
    (["a", "a"], None, None, "two tasks are named 'a'"),
    (["a", "b/c"], None, None, "task 1's name 'b/c': a job group's task is named with letters, digits and dashes"),
    (["a", "b"], [], None, "primary_tasks is empty"),
    (["a", "b"], ["c"], None, "primary_tasks names 'c', which is no task of the group (its tasks: a, b)"),
    (["a", "b"], ["a"], {"z": 1}, "termination_delay names 'z', which is no task of the group"),
    (["a", "b"], ["a"], {"b": "x"}, "termination_delay.b: 'x' is not a delay"),
])
def test_a_header_that_cannot_hold_says_what_is_wrong(names, primary, delay, message):
    with pytest.raises(TaskError) as err:
        auxiliary_delays(names, primary, delay, "g.yaml")
    assert str(err.value).startswith("g.yaml: ") and message in str(err.value)


@settings(max_examples=300, deadline=None)
@given(value=st.one_of(st.text(max_size=12), st.floats(), st.integers(), st.none(), st.booleans()))
def test_any_delay_gives_seconds_in_bounds_or_one_line(value):
    try:
        seconds = parse_delay(value, "d")
    except TaskError as exc:
        assert "\n" not in str(exc)
        return
    assert 0 <= seconds <= MAX_TERMINATION_DELAY
