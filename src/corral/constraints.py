"""Slurm's `--constraint` language, read far enough for placement to know which nodes can run a job.

`man sbatch` defines it: feature names joined by `&` (AND; older scripts write `,`) and `|` (OR),
grouped by parentheses, `name*N` (N of the job's nodes need it), `[a|b]` (matching OR: all nodes share
one) and `[a*2&b*4]` (multiple counts), and `!name` (NOT) in recent Slurm.

Placement asks two things of it: does this node satisfy it on its own (`node_ok`), and, for counted
terms, how many nodes of the partition must carry each counted feature (`counts`). Counts and
brackets are read leniently: a counted term holds on every node and its count is checked against the
whole partition, and a matching OR (`[a|b]`) is an OR per node. Slurm stays the judge: a cluster that rejects the job makes
Corral fail over. An expression this module cannot read constrains nothing here (`parse_constraint`
returns None) and goes to Slurm as written. Pure: no I/O.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass

_TOKEN = re.compile(r"\s*(?:(?P<name>[A-Za-z0-9_.:=+\-/@%]+)|(?P<op>[&|,()\[\]*!]))", re.ASCII)

NodeTest = Callable[[frozenset[str]], bool]


@dataclass(frozen=True)
class Constraint:
    """A parsed `--constraint`: a test of one node's features, and the counted features' minimums."""

    text: str
    node_ok: NodeTest
    counts: tuple[tuple[str, int], ...] = ()  # (feature, nodes that must have it)

    def short_of(self, features_per_node: list[frozenset[str]]) -> str | None:
        """Why these nodes cannot hold the job's counted features, or None when they can."""
        for feature, count in self.counts:
            have = sum(1 for features in features_per_node if feature in features)
            if have < count:
                return f"--constraint={self.text} needs {count} node(s) with {feature}; the partition has {have}"
        return None


class _Unreadable(Exception):
    pass


def parse_constraint(text: str | None) -> Constraint | None:
    """The constraint, or None when there is none or it cannot be read (Slurm then decides alone)."""
    if not text or not text.strip():
        return None
    try:
        tokens = _tokens(text)
        parser = _Parser(tokens)
        test = parser.expression()
        if parser.position != len(tokens):
            raise _Unreadable
    except _Unreadable:
        return None
    return Constraint(text, test, tuple(parser.counts))


def _tokens(text: str) -> list[str]:
    out: list[str] = []
    position = 0
    text = text.strip()
    while position < len(text):
        match = _TOKEN.match(text, position)
        if match is None or match.end() == position:
            raise _Unreadable
        out.append(match.group("name") or match.group("op"))
        position = match.end()
    return out


class _Parser:
    """Recursive descent: OR of ANDs of terms; a term is `!term`, `(expr)`, `[expr]` or `name[*N]`."""

    def __init__(self, tokens: list[str]) -> None:
        self.tokens = tokens
        self.position = 0
        self.counts: list[tuple[str, int]] = []

    def _peek(self) -> str | None:
        return self.tokens[self.position] if self.position < len(self.tokens) else None

    def _take(self) -> str:
        token = self._peek()
        if token is None:
            raise _Unreadable
        self.position += 1
        return token

    def expression(self) -> NodeTest:
        alternatives = [self._conjunction()]
        while self._peek() == "|":
            self._take()
            alternatives.append(self._conjunction())
        if len(alternatives) == 1:
            return alternatives[0]
        return lambda features: any(test(features) for test in alternatives)

    def _conjunction(self) -> NodeTest:
        parts = [self._term()]
        while self._peek() in ("&", ","):
            self._take()
            parts.append(self._term())
        if len(parts) == 1:
            return parts[0]
        return lambda features: all(test(features) for test in parts)

    def _term(self) -> NodeTest:
        token = self._take()
        if token == "!":
            inner = self._term()
            return lambda features: not inner(features)
        if token in ("(", "["):
            closing = ")" if token == "(" else "]"
            counts_before = len(self.counts)
            inner = self.expression()
            if self._take() != closing:
                raise _Unreadable
            if len(self.counts) > counts_before or self._count() is not None:
                return lambda features: True  # counted: checked on the partition, not per node
            return inner  # a matching OR holds per node; that all nodes share one is Slurm's to check
        if not _is_name(token):
            raise _Unreadable
        count = self._count()
        if count is not None:
            self.counts.append((token, count))
            return lambda features: True
        return lambda features: token in features

    def _count(self) -> int | None:
        if self._peek() != "*":
            return None
        self._take()
        number = self._take()
        if not number.isdigit() or int(number) < 1:
            raise _Unreadable
        return int(number)


def _is_name(token: str) -> bool:
    return token not in "&|,()[]*!"
