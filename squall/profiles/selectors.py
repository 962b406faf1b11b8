"""Node selectors (``0``, ``last``, ``"0-3"``, ``odd``, ``"part 2/2"``) and link expressions (``a -> b``).

A profile does not know the number of workers ``n`` in advance, so selectors are kept as written
and resolved for a given ``n``. Explicit indices outside ``0..n-1`` are an error at that point;
relative selectors (``last``, ``odd``, ``part I/K``) adapt to ``n``. A selector that needs more
workers than a cluster can have (:data:`~.bounds.MAX_WORKERS`) is an error as soon as it is read, and
so is a link expression whose two sides can only ever name the same node (``3 -> 3``, ``last <-> -1``):
a node's traffic to itself crosses no link. Expressions that include such pairs among real links
(``all -> all``, ``0-3 <-> 2-5``) simply skip them.
"""

from __future__ import annotations

import functools
import re
from dataclasses import dataclass
from typing import Final

from squall.profiles.bounds import MAX_WORKERS
from squall.profiles.errors import Origin

SELECTOR_ALLOWED: Final = (
    "a node index (0, 3; -1 is the last), first, last, all, odd, even, a range 'A-B' "
    "(inclusive, B may be 'last'), 'part I/K' (the I-th of K near-equal contiguous blocks), "
    "a comma-separated string or a list of these"
)
LINK_ALLOWED: Final = "'A -> B' (directed) or 'A <-> B' (both directions)"

_KEYWORDS: Final = ("all", "first", "last", "odd", "even")
_INDEX: Final = re.compile(r"^-?\d+$")
_RANGE: Final = re.compile(r"^(\d+|first)\s*-\s*(\d+|last)$")
_PART: Final = re.compile(r"^part\s*(\d+)\s*/\s*(\d+)$")
_ARROW: Final = re.compile(r"<->|->")
_LAST: Final = -1


@dataclass(frozen=True, order=True)
class _Term:
    """One element of a selector."""

    kind: str  # "index", "range", "part" or one of _KEYWORDS
    a: int = 0  # index; range start; part number (1-based)
    b: int = 0  # range end (_LAST = the last node); number of parts


@dataclass(frozen=True)
class NodeSelector:
    """A set of nodes as written in the profile, resolved for a given number of workers."""

    origin: Origin  # where it was written, for errors
    text: str  # as written, for messages and tables
    terms: tuple[_Term, ...]  # the union of these

    def nodes(self, n: int) -> frozenset[int]:
        """The nodes selected among ``0..n-1``; explicit indices out of range raise ProfileError."""
        return _resolve(self, n)

    def min_workers(self) -> int:
        """The smallest ``n`` for which every explicit index is in range."""
        return self.requirement()[0]

    def requirement(self) -> tuple[int, str]:
        """(the smallest ``n`` for which every explicit index is in range, the term that needs it)."""
        need, what = 1, ""
        for term in self.terms:
            for workers, name in _needs(term):
                if workers > need:
                    need, what = workers, name
        return need, what

    def __str__(self) -> str:
        return self.text


def _needs(term: _Term) -> list[tuple[int, str]]:
    """The cluster sizes a term needs, each with the words that name what needs it."""
    if term.kind == "index":
        return [(term.a + 1 if term.a >= 0 else -term.a, f"node {term.a}")]
    if term.kind == "range":
        return [(term.a + 1, f"node {term.a}")] + ([(term.b + 1, f"node {term.b}")] if term.b != _LAST else [])
    if term.kind == "part":
        return [(term.b, f"part {term.a}/{term.b}")]
    return []


def _term(origin: Origin, text: str) -> _Term:
    """Parse one selector element."""
    token = text.strip().lower()
    if token in _KEYWORDS:
        return _Term(token)
    if _INDEX.match(token):
        return _Term("index", int(token))
    if match := _RANGE.match(token):
        start = 0 if match.group(1) == "first" else int(match.group(1))
        end = _LAST if match.group(2) == "last" else int(match.group(2))
        if end != _LAST and start > end:
            raise origin.error("range start is above its end", value=text, allowed=SELECTOR_ALLOWED)
        return _Term("range", start, end)
    if match := _PART.match(token):
        part, parts = int(match.group(1)), int(match.group(2))
        if not 1 <= part <= parts:
            raise origin.error("part I/K needs 1 <= I <= K", value=text, allowed=SELECTOR_ALLOWED)
        return _Term("part", part, parts)
    raise origin.error("not a node selector", value=text, allowed=SELECTOR_ALLOWED)


def parse_selector(origin: Origin, raw: object) -> NodeSelector:
    """Read a selector written as an int, a string (comma-separated) or a list of those."""
    items: list[object] = raw if isinstance(raw, list) else [raw]
    terms: list[_Term] = []
    for item in items:
        if isinstance(item, bool) or not isinstance(item, int | str):
            raise origin.error("not a node selector", value=raw, allowed=SELECTOR_ALLOWED)
        parts = [str(item)] if isinstance(item, int) else item.split(",")
        terms.extend(_term(origin, part) for part in parts)
    if not terms:
        raise origin.error("selects no node", value=raw, allowed=SELECTOR_ALLOWED)
    text = ", ".join(str(item) for item in items)
    selector = NodeSelector(origin, text, tuple(terms))
    need, what = selector.requirement()
    if need > MAX_WORKERS:
        raise origin.error(
            f"{what} needs at least {need} workers, more than the {MAX_WORKERS} a cluster can have",
            value=raw,
            allowed=f"indices 0..{MAX_WORKERS - 1} (or -{MAX_WORKERS}..-1), parts I/K with K <= {MAX_WORKERS}, "
            "or relative selectors such as last, odd, part 2/2",
        )
    return selector


def _index(selector: NodeSelector, index: int, n: int) -> int:
    """An explicit index resolved for n workers, or a ProfileError naming the selector's key."""
    node = index if index >= 0 else n + index
    if not 0 <= node < n:
        need, what = selector.requirement()
        raise selector.origin.error(
            f"node {index} is out of range for {n} workers: the profile needs at least {need} workers "
            f"({what} in {selector.origin.key})",
            value=selector.text,
            allowed=f"indices 0..{n - 1} (or -{n}..-1), or relative selectors such as last, odd, part 2/2",
        )
    return node


def _select(selector: NodeSelector, n: int) -> frozenset[int]:
    """Resolution of a selector for n workers."""
    nodes: set[int] = set()
    for term in selector.terms:
        if term.kind == "index":
            nodes.add(_index(selector, term.a, n))
        elif term.kind == "range":
            start = _index(selector, term.a, n)
            end = n - 1 if term.b == _LAST else _index(selector, term.b, n)
            nodes.update(range(start, end + 1))
        elif term.kind == "part":
            nodes.update(range((term.a - 1) * n // term.b, term.a * n // term.b))
        elif term.kind == "all":
            nodes.update(range(n))
        elif term.kind == "first" and n > 0:
            nodes.add(0)
        elif term.kind == "last" and n > 0:
            nodes.add(n - 1)
        elif term.kind in ("odd", "even"):
            nodes.update(range(0 if term.kind == "even" else 1, n, 2))
    return frozenset(nodes)


_resolve: Final = functools.lru_cache(maxsize=8192)(_select)  # cached: resolved for every link


def split_arrow(origin: Origin, raw: object) -> tuple[str, bool, str]:
    """Split ``'A -> B'`` / ``'A <-> B'`` into (A, symmetric, B)."""
    if not isinstance(raw, str):
        raise origin.error("must be a link expression string", value=raw, allowed=LINK_ALLOWED)
    match = _ARROW.search(raw)
    left, right = (raw[: match.start()].strip(), raw[match.end() :].strip()) if match else ("", "")
    if match is None or not left or not right or _ARROW.search(right):
        raise origin.error("not a link expression", value=raw, allowed=LINK_ALLOWED)
    return left, match.group(0) == "<->", right


@dataclass(frozen=True)
class PairExpr:
    """Links between two node sets: ``src -> dst`` or ``src <-> dst``."""

    origin: Origin  # where it was written, for errors
    text: str  # as written
    src: NodeSelector  # sending side (either side when symmetric)
    dst: NodeSelector  # receiving side (either side when symmetric)
    symmetric: bool  # True for <->: both directions

    def covers(self, src: int, dst: int, n: int) -> bool:
        """Whether the directed link src->dst is one of these links."""
        if src == dst:
            return False
        if src in self.src.nodes(n) and dst in self.dst.nodes(n):
            return True
        return self.symmetric and src in self.dst.nodes(n) and dst in self.src.nodes(n)

    def canonical(self) -> tuple[object, ...]:
        """A key under which two expressions that say the same thing compare equal."""
        ends = (
            sorted([self.src.terms, self.dst.terms]) if self.symmetric else [self.src.terms, self.dst.terms]
        )
        return (self.symmetric, *ends)

    def __str__(self) -> str:
        return self.text


def parse_pair(origin: Origin, raw: object) -> PairExpr:
    """Read a node link expression such as ``"0 -> last"`` or ``"0-3 <-> 4-7"``; refuse one that only
    ever names a node and itself."""
    left, symmetric, right = split_arrow(origin, raw)
    expr = PairExpr(origin, str(raw), parse_selector(origin, left), parse_selector(origin, right), symmetric)
    if not _names_a_link(expr):
        raise origin.error(
            f"links a node to itself (both sides name the same one node at every cluster size up to "
            f"{MAX_WORKERS}; a node's traffic to itself crosses no link)",
            value=raw,
            allowed=f"two different nodes, e.g. '3 -> 4'; {LINK_ALLOWED} (in 'all -> all' and the like, "
            "a node and itself are skipped)",
        )
    return expr


def _names_a_link(expr: PairExpr) -> bool:
    """Whether some cluster size the expression can be used at gives it a link between two different nodes.

    Usually the first size decides (``0 -> 1`` at 2 workers); only an expression that never names a
    link looks at every size, uncached, up to :data:`~.bounds.MAX_WORKERS`.
    """
    first = max(2, expr.src.min_workers(), expr.dst.min_workers())
    for n in range(first, MAX_WORKERS + 1):
        src, dst = _select(expr.src, n), _select(expr.dst, n)
        if src and dst and len(src | dst) >= 2:
            return True
    return False
