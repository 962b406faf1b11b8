"""Churn: nodes killed, paused and restarted, links cut, the network partitioned, in time.

``churn.events`` are written out one by one (``churn.trace`` reads more of them from an availability
trace, :mod:`.availability`); ``churn.random`` entries are seeded random processes
that expand into concrete events once the number of workers and the run's duration are known.

Random expansion: every eligible target (a node, or an unordered pair of nodes for ``link_down``)
has its own Poisson process, drawn from ``random.Random("squall-churn:SEED:KIND:TARGET")``, so the
events are the same for the same seed on any machine, a longer run only adds events at the end, and
adding workers leaves the existing targets' draws alone. Arrivals are taken in time order; one is
skipped when its target is already down (by this or any earlier entry, or by ``churn.events``) or
when ``max_concurrent`` targets are down.

Bounded work: before anything is drawn, the number of failures the random entries will draw in a run
of n workers is computed (``targets x rate x window`` per entry; a sum of Poisson counts), and a run
whose count may exceed :data:`MAX_CHURN_DRAWS` is refused, naming the entry, the count and the bound.
Drawing stops with the same error should a seed still draw more (probability below 1e-8).
"""

from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Final

from squall.profiles.errors import Origin, ProfileError, Section, expect_list
from squall.profiles.model import ChurnEvent, ChurnKind
from squall.profiles.selectors import NodeSelector, PairExpr, parse_pair, parse_selector
from squall.profiles.units import (
    parse_duration_range_us,
    parse_duration_us,
    parse_event_rate,
    parse_int,
    parse_positive_duration_us,
)

K = ChurnKind
TARGET_KEYS: Final[dict[ChurnKind, tuple[str, ...]]] = {
    K.KILL: ("nodes", "duration"),
    K.PAUSE: ("nodes", "duration"),
    K.RESUME: ("nodes",),
    K.RESTART: ("nodes",),
    K.LINK_DOWN: ("link", "duration"),
    K.LINK_UP: ("link",),
    K.PARTITION: ("groups", "duration"),
    K.HEAL: (),
}
ENDED_BY: Final = {K.KILL: K.RESTART, K.PAUSE: K.RESUME, K.LINK_DOWN: K.LINK_UP, K.PARTITION: K.HEAL}
RANDOM_KINDS: Final = (K.KILL, K.PAUSE, K.LINK_DOWN)
# At equal times, recoveries come before new failures, so "kill for 10s" and "kill at +10s" chain.
_ORDER: Final = {kind: i for i, kind in enumerate((K.RESTART, K.RESUME, K.LINK_UP, K.HEAL, *ENDED_BY))}
KINDS_ALLOWED: Final = ", ".join(kind.value for kind in ChurnKind)

Target = int | tuple[int, int]  # a node, or an unordered link (a, b) with a < b

MAX_CHURN_DRAWS: Final = 100_000  # failures all random entries may draw in one run (~0.2 s, ~20 MB to draw)
REFERENCE_RUN_S: Final = 600.0  # a run's length when its spec gives none (squall/experiment/lab.py)
_TAIL_SD: Final = 6.0  # a Poisson count exceeds mean + 6 sd + 6 with probability below 1e-8
DRAWS_ALLOWED: Final = (
    f"a rate, start/stop window, nodes or protect that keep the failures drawn by all random churn "
    f"at most {MAX_CHURN_DRAWS} per run (e.g. rate: 1/60s per target)"
)


def likely_most(mean: float) -> float:
    """A count a Poisson variable of this mean exceeds with probability below 1e-8."""
    return mean + _TAIL_SD * math.sqrt(mean) + _TAIL_SD


@dataclass(frozen=True)
class ScheduledEvent:
    """One entry of ``churn.events`` as written."""

    origin: Origin  # churn.events[i]
    at_us: int  # when
    kind: ChurnKind  # what
    nodes: NodeSelector | None = None  # kill/pause/resume/restart targets
    link: PairExpr | None = None  # link_down/link_up targets
    groups: tuple[NodeSelector, ...] = ()  # partition groups
    duration_us: int | None = None  # undo after this long (restart/resume/link_up/heal)

    def concrete(self, n: int) -> list[ChurnEvent]:
        """The event (and its undoing, with a duration) for n workers; empty if it targets nobody."""
        at = self.at_us / 1e6
        origin = self.origin.key
        nodes = tuple(sorted(self.nodes.nodes(n))) if self.nodes else ()
        links = tuple((a, b) for a in range(n) for b in range(n) if self.link and self.link.covers(a, b, n))
        groups = self._groups(n) if self.kind == K.PARTITION else ()
        if (self.nodes and not nodes) or (self.link and not links):
            return []
        events = [ChurnEvent(at, self.kind, nodes, links, groups, origin)]
        if self.duration_us is not None:
            end = (self.at_us + self.duration_us) / 1e6
            events.append(ChurnEvent(end, ENDED_BY[self.kind], nodes, links, (), origin))
        return events

    def _groups(self, n: int) -> tuple[tuple[int, ...], ...]:
        """Disjoint groups for n workers; the nodes in no group form one more group."""
        seen: dict[int, str] = {}
        groups: list[tuple[int, ...]] = []
        for selector in self.groups:
            members = sorted(selector.nodes(n))
            for node in members:
                if node in seen:
                    raise selector.origin.error(
                        f"node {node} is also in {seen[node]} (for {n} workers)",
                        value=selector.text,
                        allowed="disjoint groups",
                    )
                seen[node] = selector.origin.key
            groups.append(tuple(members))
        groups.append(tuple(node for node in range(n) if node not in seen))
        return tuple(group for group in groups if group)


@dataclass(frozen=True)
class RandomChurn:
    """One entry of ``churn.random``: a seeded random failure process."""

    origin: Origin  # churn.random[i]
    kind: ChurnKind  # kill, pause or link_down
    rate_per_s: float  # failures per second per target
    downtime_us: tuple[int, int]  # each failure lasts uniformly between these
    seed: int  # makes the events reproducible
    max_concurrent: int | None = None  # at most this many targets down at once; None = no limit
    nodes: NodeSelector | None = None  # candidates; None = all nodes
    protect: NodeSelector | None = None  # never touched (nor their links)
    start_us: int = 0  # no failure starts before this
    stop_us: int | None = None  # no failure starts at or after this; None = end of the run
    rate_text: str = ""  # the rate as written, for messages

    def _nodes(self, n: int) -> list[int]:
        chosen = self.nodes.nodes(n) if self.nodes else frozenset(range(n))
        protected = self.protect.nodes(n) if self.protect else frozenset()
        return sorted(chosen - protected)

    def targets(self, n: int) -> list[Target]:
        """Eligible nodes, or unordered links between eligible nodes."""
        nodes = self._nodes(n)
        if self.kind != K.LINK_DOWN:
            return list(nodes)
        return [(a, b) for a in nodes for b in nodes if a < b]

    def window_s(self, duration_s: float) -> float:
        """How long failures may start in a run of ``duration_s`` seconds."""
        stop = duration_s if self.stop_us is None else min(duration_s, self.stop_us / 1e6)
        return max(0.0, stop - self.start_us / 1e6)

    def expected_draws(self, n: int, duration_s: float) -> float:
        """The mean number of failures the process draws in such a run: targets x rate x window."""
        count = len(self._nodes(n))
        targets = count * (count - 1) // 2 if self.kind == K.LINK_DOWN else count
        window = self.window_s(duration_s)
        return targets * self.rate_per_s * window if targets and window else 0.0

    def too_many(self, n: int, duration_s: float, problem: str) -> ProfileError:
        """The error for a run in which the process (with the others) draws more than the bound."""
        count = len(self._nodes(n))
        what = f"{count * (count - 1) // 2} node pairs" if self.kind == K.LINK_DOWN else f"{count} nodes"
        return self.origin.at("rate").error(
            f"{problem}; this entry: {what} x {self.rate_per_s:.6g}/s x {self.window_s(duration_s):g}s "
            f"= about {self.expected_draws(n, duration_s):.6g}",
            value=self.rate_text or self.rate_per_s,
            allowed=DRAWS_ALLOWED,
        )

    def arrivals(self, n: int, duration_s: float) -> list[tuple[float, Target, float]]:
        """(start, target, downtime) of every failure the process draws, in time order."""
        stop = duration_s if self.stop_us is None else min(duration_s, self.stop_us / 1e6)
        drawn: list[tuple[float, Target, float]] = []
        for target in self.targets(n):
            name = target if isinstance(target, int) else f"{target[0]}-{target[1]}"
            rng = random.Random(f"squall-churn:{self.seed}:{self.kind.value}:{name}")
            at = self.start_us / 1e6
            while True:
                at += rng.expovariate(self.rate_per_s)
                downtime = rng.uniform(self.downtime_us[0], self.downtime_us[1]) / 1e6
                if at >= stop:
                    break
                drawn.append((round(at, 6), target, round(downtime, 6)))
                if len(drawn) > MAX_CHURN_DRAWS:
                    problem = f"drew more than {MAX_CHURN_DRAWS} failures in a {duration_s:g}s run of {n} workers"
                    raise self.too_many(n, duration_s, problem)
        return sorted(drawn, key=lambda item: (item[0], str(item[1])))

    def expand(self, n: int, duration_s: float, busy: _Busy) -> list[ChurnEvent]:
        """Concrete events, skipping arrivals whose target is busy or beyond max_concurrent."""
        events: list[ChurnEvent] = []
        mine: list[tuple[float, float]] = []  # this process's down windows
        for at, target, downtime in self.arrivals(n, duration_s):
            end = at + downtime
            down_now = sum(1 for start, stop in mine if start <= at < stop)
            if busy.overlaps(target, at, end) or (self.max_concurrent and down_now >= self.max_concurrent):
                continue
            mine.append((at, end))
            busy.add(target, at, end)
            nodes = (target,) if isinstance(target, int) else ()
            links = () if isinstance(target, int) else (target, (target[1], target[0]))
            events.append(ChurnEvent(at, self.kind, nodes, links, (), self.origin.key))
            events.append(ChurnEvent(round(end, 6), ENDED_BY[self.kind], nodes, links, (), self.origin.key))
        return events


@dataclass
class _Busy:
    """Down windows per target, so random failures never overlap other failures of the same target."""

    windows: dict[Target, list[tuple[float, float]]] = field(default_factory=dict)

    def add(self, target: Target, start: float, end: float) -> None:
        self.windows.setdefault(target, []).append((start, end))

    def overlaps(self, target: Target, start: float, end: float) -> bool:
        return any(s < end and start < e for s, e in self.windows.get(target, []))

    @classmethod
    def from_events(cls, events: list[ChurnEvent]) -> _Busy:
        """Windows of the explicit events: kill..restart, pause..resume, link_down..link_up."""
        busy, opened = cls(), dict[Target, float]()
        for event in events:
            targets: list[Target] = [*event.nodes, *{(min(a, b), max(a, b)) for a, b in event.links}]
            for target in targets:
                if event.kind in (K.KILL, K.PAUSE, K.LINK_DOWN):
                    opened.setdefault(target, event.at_s)
                elif event.kind in (K.RESTART, K.RESUME, K.LINK_UP) and target in opened:
                    busy.add(target, opened.pop(target), event.at_s)
        for target, start in opened.items():
            busy.add(target, start, math.inf)
        return busy


def sort_events(events: list[ChurnEvent]) -> list[ChurnEvent]:
    """Time order; at equal times recoveries first, then by target, so the order is total."""
    return sorted(events, key=lambda e: (e.at_s, _ORDER[e.kind], e.nodes, e.links, e.groups, e.origin))


def check_node_states(events: list[ChurnEvent], file: str) -> None:
    """Reject what a cluster cannot carry out: kill a dead node, pause a paused one, resume a live one."""
    state: dict[int, str] = {}
    for event in events:
        for node in event.nodes:
            now = state.get(node, "up")
            wrong = (
                (event.kind == K.KILL and now == "killed")
                or (event.kind == K.PAUSE and now != "up")
                or (event.kind == K.RESUME and now != "paused")
            )
            if wrong:
                raise Origin(file, event.origin).error(
                    f"cannot {event.kind.value} node {node} at {event.at_s:g}s: it is {now}",
                    allowed="kill a live or paused node, pause a live one, resume a paused one, restart any",
                )
            state[node] = {K.KILL: "killed", K.PAUSE: "paused"}.get(event.kind, "up")


def _scheduled(origin: Origin, raw: object) -> ScheduledEvent:
    """One ``churn.events`` entry."""
    kind_raw = raw.get("kind") if isinstance(raw, dict) else None
    if kind_raw not in tuple(ChurnKind):
        Section(origin, raw, ("at", "kind", "nodes", "link", "groups", "duration"))
        raise origin.at("kind").error("unknown or missing kind", value=kind_raw, allowed=KINDS_ALLOWED)
    kind = ChurnKind(str(kind_raw))
    section = Section(origin, raw, ("at", "kind", *TARGET_KEYS[kind]))
    for key in TARGET_KEYS[kind]:
        if key != "duration" and not section.has(key):
            raise origin.at(key).error(f"is required for {kind.value}")
    groups: tuple[NodeSelector, ...] = ()
    if section.has("groups"):
        items = expect_list(origin.at("groups"), section.value("groups"), "node selectors")
        groups = tuple(parse_selector(origin.at("groups").at(i), item) for i, item in enumerate(items))
        if not groups:
            raise origin.at("groups").error("is empty", allowed="at least one group of nodes")
    return ScheduledEvent(
        origin=origin,
        at_us=section.require("at", parse_duration_us, "a time such as 30s"),
        kind=kind,
        nodes=parse_selector(origin.at("nodes"), section.value("nodes")) if section.has("nodes") else None,
        link=parse_pair(origin.at("link"), section.value("link")) if section.has("link") else None,
        groups=groups,
        duration_us=section.get("duration", parse_positive_duration_us),
    )


def _random(origin: Origin, raw: object) -> RandomChurn:
    """One ``churn.random`` entry."""
    keys = ("kind", "rate", "downtime", "seed", "max_concurrent", "nodes", "protect", "start", "stop")
    section = Section(origin, raw, keys)
    kind_raw = section.value("kind") if section.has("kind") else None
    if kind_raw not in tuple(RANDOM_KINDS):
        raise origin.at("kind").error(
            "unknown or missing kind for random churn",
            value=kind_raw,
            allowed=", ".join(k.value for k in RANDOM_KINDS),
        )

    def selector(key: str) -> NodeSelector | None:
        return parse_selector(origin.at(key), section.value(key)) if section.has(key) else None

    churn = RandomChurn(
        origin=origin,
        kind=ChurnKind(str(kind_raw)),
        rate_per_s=section.require("rate", parse_event_rate, "COUNT/DURATION per target, e.g. 1/60s"),
        downtime_us=section.require("downtime", parse_duration_range_us, "e.g. 5s..15s"),
        seed=section.require("seed", lambda v: parse_int(v, 0), "a whole number >= 0"),
        max_concurrent=section.get("max_concurrent", lambda v: parse_int(v, 1)),
        nodes=selector("nodes"),
        protect=selector("protect"),
        start_us=section.get("start", parse_duration_us) or 0,
        stop_us=section.get("stop", parse_positive_duration_us),
        rate_text=str(section.value("rate")),
    )
    if churn.stop_us is not None and churn.stop_us <= churn.start_us:
        raise origin.at("stop").error(
            "is not after start", value=section.value("stop"), allowed="stop > start"
        )
    return churn


@dataclass(frozen=True)
class ChurnPlan:
    """Everything under ``churn:``."""

    origin: Origin  # the "churn" key
    events: tuple[ScheduledEvent, ...] = ()  # written out
    random: tuple[RandomChurn, ...] = ()  # drawn

    def selectors(self) -> list[NodeSelector]:
        """Every node selector written here (to check them against n)."""
        found: list[NodeSelector] = []
        for event in self.events:
            found += [s for s in (event.nodes, *event.groups) if s is not None]
            found += [event.link.src, event.link.dst] if event.link else []
        for entry in self.random:
            found += [s for s in (entry.nodes, entry.protect) if s is not None]
        return found

    def scheduled(self, n: int) -> list[ChurnEvent]:
        """The written-out events for n workers, in order, checked for impossible sequences."""
        events = sort_events([e for entry in self.events for e in entry.concrete(n)])
        check_node_states(events, self.origin.file)
        return events

    def check_draws(self, n: int, duration_s: float) -> None:
        """Refuse a run of n workers and ``duration_s`` seconds in which random churn may draw more
        than :data:`MAX_CHURN_DRAWS` failures (computed, nothing drawn)."""
        means = [(entry.expected_draws(n, duration_s), i) for i, entry in enumerate(self.random)]
        total = sum(mean for mean, _ in means)
        if means and likely_most(total) > MAX_CHURN_DRAWS:
            _, worst = max(means)
            raise self.random[worst].too_many(
                n,
                duration_s,
                f"random churn draws about {total:.6g} failures in a {duration_s:g}s run of {n} workers "
                f"(up to {likely_most(total):.6g}), more than the {MAX_CHURN_DRAWS} a run may have",
            )

    def expand(self, n: int, duration_s: float) -> list[ChurnEvent]:
        """All events for n workers that happen before ``duration_s``, sorted."""
        if self.random and not math.isfinite(duration_s):
            raise ValueError("random churn needs a finite run duration")
        self.check_draws(n, duration_s)
        events = self.scheduled(n)
        busy = _Busy.from_events(events)
        for entry in self.random:
            events += entry.expand(n, duration_s, busy)
        return sort_events([event for event in events if event.at_s < duration_s])


def parse_churn(origin: Origin, raw: object) -> ChurnPlan:
    """Read ``churn: {events: [...], random: [...], trace: FILE}`` (``trace``: :mod:`.availability`)."""
    from squall.profiles.availability import load_availability  # it builds this module's events

    section = Section(origin, raw, ("events", "random", "trace"))

    def entries(key: str) -> list[tuple[Origin, object]]:
        if not section.has(key):
            return []
        items = expect_list(origin.at(key), section.value(key), f"churn {key} entries")
        return [(origin.at(key).at(i), item) for i, item in enumerate(items)]

    events = tuple(_scheduled(o, item) for o, item in entries("events"))
    if section.has("trace"):
        events += load_availability(origin.at("trace"), section.value("trace"))
    randoms = tuple(_random(o, item) for o, item in entries("random"))
    return ChurnPlan(origin, events, randoms)
