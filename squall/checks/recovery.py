"""The faults a run went through and how long the ranks took to make progress again after each (pure).

A run's realised timeline (``RunMeta.timeline``, :mod:`squall.experiment.realised`) says what was done
and when, on the run's clock (seconds from the start): node churn (``kill`` ended by ``restart``,
``pause`` by ``resume``) and link changes labelled by what caused them (``link_down (churn.events[1])``
ended by the ``link_up`` of the same entry, ``partition`` by ``heal``, ``phase NAME`` by the next
phase). Each becomes one :class:`~squall.run_meta.FaultEvent`:

* ``at_s`` and ``end_s``: when it was applied and undone (None: it lasted to the end of the run);
* ``recovered_after_s``: from ``end_s`` until every surviving rank printed a figure again (the
  first record of each after the end; the slowest decides); None when one never did;
* ``progressed``: every surviving rank it did not strike printed a figure in the second half of it (a
  line or two printed just after it began does not count), so the program went on through it
  (``survived``) rather than waiting for it to end.

A phase is a fault when its links differ from the run's first state (a loss or delay phase); the
phase that puts the links back only ends the one before. Records are on the trace's clock (from the
first figure), the timeline on the run's: ``RunMeta.startup_s`` converts one to the other.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from typing import Any

from squall.run_meta import FaultEvent
from squall.run_trace import RunTrace

#: Node churn kinds that begin a fault, and the kind that ends each.
NODE_FAULTS = {"kill": "restart", "pause": "resume"}
#: Link churn kinds that begin a fault, and the kind that ends each.
LINK_FAULTS = {"link_down": "link_up", "partition": "heal"}
_LABEL = re.compile(r"^(\w+)(?: \((.*)\))?$")


def _nodes_of(change: Mapping[str, Any]) -> tuple[int, ...]:
    """The nodes at either end of the links a realised change touched."""
    nodes: set[int] = set()
    for group in change.get("links") or []:
        for label in group.get("links") or []:
            src, _, dst = str(label).partition("->")
            if src.strip().isdigit() and dst.strip().isdigit():
                nodes.update((int(src), int(dst)))
    return tuple(sorted(nodes))


def _settings(change: Mapping[str, Any]) -> dict[str, Any]:
    return {str(link): group.get("settings") for group in change.get("links") or []
            for link in group.get("links") or []}


def _open(events: list[dict[str, Any]], kind: str, *, key: str = "", nodes: tuple[int, ...] = ()) -> dict[str, Any]:
    """The earliest fault still open of ``kind`` (and ``key``, or sharing ``nodes``), or {} when none."""
    for event in events:
        if event["kind"] != kind or event["end_s"] is not None:
            continue
        if (key and event["key"] == key) or (not key and (not nodes or set(nodes) & set(event["nodes"]))):
            return event
    return {}


def fault_windows(timeline: Mapping[str, Any]) -> list[dict[str, Any]]:
    """Every fault of a realised timeline: ``{kind, nodes, at_s, end_s, label}`` in time order (run clock)."""
    events: list[dict[str, Any]] = []
    changes = list(timeline.get("changes") or [])
    first = _settings(changes[0]) if changes else {}
    steps: list[tuple[float, int, str, Mapping[str, Any]]] = []
    for change in changes[1:]:
        for label in str(change.get("label", "")).split("; "):
            steps.append((float(change.get("applied_s", change.get("at_s", 0.0))), 1, label, change))
    for row in timeline.get("churn") or []:
        steps.append((float(row.get("applied_s", row.get("at_s", 0.0))), 0, str(row.get("kind", "")), row))
    for t, is_link, label, row in sorted(steps, key=lambda s: (s[0], s[1])):
        if not is_link:
            nodes = tuple(int(n) for n in row.get("nodes") or ())
            if label in NODE_FAULTS:
                events.append({"kind": label, "nodes": nodes, "at_s": t, "end_s": None, "label": label, "key": ""})
            for kind, ender in NODE_FAULTS.items():
                if label == ender and (event := _open(events, kind, nodes=nodes)):
                    event["end_s"] = t
            continue
        m = _LABEL.match(label)
        kind, origin = (m.group(1), m.group(2) or "") if m else (label, "")
        if label.startswith("phase"):
            for event in events:
                if event["kind"] == "phase" and event["end_s"] is None:
                    event["end_s"] = t
            settings = _settings(row)
            if any(first.get(link) != value for link, value in settings.items()):
                events.append({"kind": "phase", "nodes": _nodes_of(row), "at_s": t, "end_s": None, "label": label,
                               "key": ""})
        elif kind in LINK_FAULTS:
            events.append({"kind": kind, "nodes": _nodes_of(row), "at_s": t, "end_s": None, "label": label,
                           "key": origin})
        else:
            for fault, ender in LINK_FAULTS.items():
                if kind == ender and (event := _open(events, fault, key=origin) or _open(events, fault)):
                    event["end_s"] = t
    return sorted(events, key=lambda e: e["at_s"])


def fault_events(trace: RunTrace) -> tuple[FaultEvent, ...]:
    """Every fault of ``trace``'s realised timeline with the recovery after it (see the module docstring)."""
    offset = trace.meta.startup_s  # run clock = trace clock + offset
    times: dict[int, list[float]] = {}
    for rec in trace.records:
        times.setdefault(rec.worker, []).append(rec.t + offset)
    alive = list(trace.alive)
    out = []
    for event in fault_windows(trace.meta.timeline):
        at, end = event["at_s"], event["end_s"]
        struck = set(event["nodes"]) if event["kind"] in NODE_FAULTS else set()
        recovered: float | None = None
        if end is not None:
            firsts = [next((t for t in times.get(rank, []) if t > end), None) for rank in alive]
            if alive and all(f is not None for f in firsts):
                recovered = round(max(f for f in firsts if f is not None) - end, 3)
        others = [rank for rank in alive if trace.node_of(rank) not in struck]  # churn strikes nodes
        last = max((t for ts in times.values() for t in ts), default=at)
        half = at + ((end if end is not None else last) - at) / 2  # the fault's second half
        until = end if end is not None else float("inf")
        progressed = bool(others) and all(any(half < t < until for t in times.get(rank, [])) for rank in others)
        out.append(FaultEvent(event["kind"], tuple(event["nodes"]), round(at, 3),
                              None if end is None else round(end, 3), recovered, progressed, event["label"]))
    return tuple(out)


def describe(events: Sequence[FaultEvent]) -> list[str]:
    """One line per fault: ``pause of [1] at 10.0-30.0 s: recovered after 0.4 s``."""
    lines = []
    for e in events:
        span = f"{e.at_s:.1f}-{e.end_s:.1f} s" if e.end_s is not None else f"{e.at_s:.1f} s to the end"
        on = f" of {list(e.nodes)}" if e.nodes else ""
        lines.append(f"{e.kind}{on} at {span}: {e.outcome}")
    return lines
