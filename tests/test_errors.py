"""How error messages are written and printed (errors.py)."""

from __future__ import annotations

from corral.errors import listed, printable, printed


def test_a_list_prints_one_item_a_line_and_no_value_breaks_a_line_or_moves_the_cursor():
    message = listed("no cluster can run this task:", ["a: no H100", "b: odd\nname \x1b[2J"])
    assert message == "no cluster can run this task:\n  a: no H100\n  b: odd\\nname \\x1b[2J"
    assert printed(message) == message
    assert printed("file 'x\ncorral: ok' \x1b[31m") == "file 'x\\ncorral: ok' \\x1b[31m"
    assert printed("a\n  b\tc") == "a\n  b\\tc"  # a list's break is kept (listed wrote it)
    assert printable(printable("é\r\n")) == "é\\r\\n"  # printing twice escapes nothing more
