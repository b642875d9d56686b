"""Slurm's --constraint language, as placement reads it."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from corral.constraints import parse_constraint


def ok(text: str, *features: str) -> bool:
    constraint = parse_constraint(text)
    assert constraint is not None, text
    return constraint.node_ok(frozenset(features))


def test_and_or_parentheses_and_not():
    assert ok("ib", "ib") and not ok("ib", "eth")
    assert ok("ib&hdr", "ib", "hdr") and not ok("ib&hdr", "ib")
    assert ok("ib,hdr", "ib", "hdr") and not ok("ib,hdr", "hdr")  # the comma of older scripts is an AND
    assert ok("a100|h100", "h100") and not ok("a100|h100", "l4")
    assert ok("(a100|h100)&ib", "h100", "ib") and not ok("(a100|h100)&ib", "h100")
    assert ok("ib&a100|h100", "h100")  # & binds tighter than |
    assert ok("!knl", "skylake") and not ok("!knl", "knl")
    assert ok("[rack1|rack2]", "rack2") and not ok("[rack1|rack2]", "rack3")


def test_counts_are_checked_on_the_partition_not_per_node():
    constraint = parse_constraint("[rack1*2&rack2*4]")
    assert constraint is not None and constraint.node_ok(frozenset())
    assert constraint.counts == (("rack1", 2), ("rack2", 4))
    nodes = [frozenset({"rack1"})] * 2 + [frozenset({"rack2"})] * 3
    assert constraint.short_of(nodes) == "--constraint=[rack1*2&rack2*4] needs 4 node(s) with rack2; the partition has 3"
    assert constraint.short_of(nodes + [frozenset({"rack2"})]) is None
    assert parse_constraint("ib*2&gpu").node_ok(frozenset({"gpu"}))


@pytest.mark.parametrize("text", ["", "  ", None, "ib&", "(ib", "ib)", "ib*0", "ib**2", "a b", "ib*x", "[ib"])
def test_what_cannot_be_read_constrains_nothing(text):
    assert parse_constraint(text) is None


@given(st.text(alphabet="ab&|,()[]*!12 ", max_size=30))
def test_any_text_parses_or_is_left_to_slurm(text):
    constraint = parse_constraint(text)
    if constraint is not None:
        assert isinstance(constraint.node_ok(frozenset({"a"})), bool)
