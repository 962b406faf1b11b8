"""The realised timeline of a run: what was applied to the links and the nodes, and when (pure).

Every result records it under ``meta["timeline"]``::

    {"in_place": true, "duration_s": 30.0,
     "changes": [{"index": 0, "at_s": 0.0, "applied_s": 0.0, "lateness_s": 0.0, "label": "start",
                  "errors": [], "links": [{"links": ["0->1", "1->0"], "settings": {...LinkSpec...}},
                                          {"links": ["2->3"], "settings": "cut"}],
                  "node_links": [{"node": 1, "uplink_bps": 20000000, "downlink_bps": null}]}, ...],
     "churn": [{"at_s": 12.0, "applied_s": 12.004, "kind": "kill", "nodes": [2]}, ...]}

The first change holds every link; each later one only the links (and node caps) that changed, so
the states can be rebuilt one after another (:func:`replayed`). A replay (``squall run --replay``)
runs exactly this timeline again: the same states at the same times, the same node churn, whatever
the profile file says today.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from squall.experiment.timeline import Action
from squall.profiles import LinkSpec, NodeLinkSpec
from squall.profiles.model import Chance, Distribution, GilbertElliott, Jitter, Loss
from squall.shaping import LinkState, TimedState
from squall.shaping.planning.changes import changed_links

CUT = "cut"


class ReplayError(ValueError):
    """A recorded timeline that cannot be replayed; says what is wrong with it."""


def _label(pair: tuple[int, int]) -> str:
    return f"{pair[0]}->{pair[1]}"


def link_groups(state: LinkState, pairs: Sequence[tuple[int, int]]) -> list[dict[str, Any]]:
    """``pairs`` of ``state`` grouped by their settings (a cut link's settings are ``cut``)."""
    groups: dict[str, dict[str, Any]] = {}
    for pair in pairs:
        settings: Any = CUT if pair in state.blocked else state.links.get(pair, LinkSpec()).to_dict()
        key = repr(settings)
        groups.setdefault(key, {"links": [], "settings": settings})["links"].append(_label(pair))
    return list(groups.values())


def node_caps(before: LinkState | None, after: LinkState) -> list[dict[str, Any]]:
    """The nodes whose shared up- or downlink cap differs from ``before`` (every capped node without one)."""
    nodes = set(after.node_links) | (set(before.node_links) if before else set())
    out = []
    for node in sorted(nodes):
        caps = after.node_links.get(node, NodeLinkSpec())
        if before is None or before.node_links.get(node, NodeLinkSpec()) != caps:
            out.append({"node": node, "uplink_bps": caps.uplink_bps, "downlink_bps": caps.downlink_bps})
    return out


def change_records(timeline: Sequence[TimedState], done_at: Mapping[int, tuple[float, Sequence[str]]]
                   ) -> list[dict[str, Any]]:
    """One record per change of ``timeline`` that was done: ``done_at`` maps its index to (seconds
    after the start it was done, its errors); change 0 is done at 0."""
    records = []
    before: LinkState | None = None
    for index, timed in enumerate(timeline):
        if index not in done_at:
            continue
        applied_s, errors = done_at[index]
        records.append({
            "index": index, "at_s": timed.at_s, "applied_s": round(applied_s, 6),
            "lateness_s": round(applied_s - timed.at_s, 6), "label": timed.label, "errors": list(errors),
            "links": link_groups(timed.state, changed_links(before, timed.state)),
            "node_links": node_caps(before, timed.state),
        })
        before = timed.state
    return records


def churn_records(done: Sequence[tuple[Action, float]]) -> list[dict[str, Any]]:
    """Each node churn action as executed: when it was due, when it ran, what, on which nodes."""
    return [{"at_s": action.at_s, "applied_s": round(t, 6), "kind": action.kind, "nodes": list(action.nodes),
             "label": action.label} for action, t in done if action.kind != "reshape"]


# ----------------------------------------------------------------------------- replay


def _spec(data: Mapping[str, Any]) -> LinkSpec:
    """A LinkSpec from :meth:`LinkSpec.to_dict`'s output."""
    try:
        jitter_data = dict(data.get("jitter", {}))
        jitter = Jitter(int(jitter_data.get("amount_us", 0)), Distribution(jitter_data.get("distribution", "uniform")),
                        float(jitter_data.get("correlation", 0.0)))
        loss_data = dict(data.get("loss", {}))
        ge = loss_data.pop("gemodel", None)
        loss = Loss(**loss_data, gemodel=GilbertElliott(**ge) if ge else None)
        return LinkSpec(delay_us=int(data.get("delay_us", 0)), jitter=jitter, loss=loss,
                        duplicate=Chance(**data.get("duplicate", {})), reorder=Chance(**data.get("reorder", {})),
                        rate_bps=data.get("rate_bps"), limit_packets=data.get("limit_packets"))
    except (TypeError, ValueError) as exc:
        raise ReplayError(f"a recorded link setting cannot be read: {exc}") from None


def _pair(label: str) -> tuple[int, int]:
    src, sep, dst = label.partition("->")
    if not sep or not src.strip().isdigit() or not dst.strip().isdigit():
        raise ReplayError(f"a recorded link {label!r} is not 'A->B'")
    return int(src), int(dst)


def replayed(record: Mapping[str, Any], n: int) -> tuple[list[TimedState], list[Action]]:
    """The link states and node churn actions of a recorded timeline, for a cluster of ``n``."""
    changes = record.get("changes")
    if not isinstance(changes, list) or not changes:
        raise ReplayError("the result has no recorded timeline (meta.timeline.changes)")
    links: dict[tuple[int, int], LinkSpec] = {}
    blocked: set[tuple[int, int]] = set()
    caps: dict[int, NodeLinkSpec] = {}
    timeline: list[TimedState] = []
    for change in changes:
        for group in change.get("links", []):
            for label in group.get("links", []):
                pair = _pair(label)
                if not all(0 <= node < n for node in pair):
                    raise ReplayError(f"recorded link {label} is outside a cluster of {n}")
                if group.get("settings") == CUT:
                    blocked.add(pair)
                else:
                    blocked.discard(pair)
                    links[pair] = _spec(group["settings"])
        for cap in change.get("node_links", []):
            caps[int(cap["node"])] = NodeLinkSpec(cap.get("uplink_bps"), cap.get("downlink_bps"))
        state = LinkState(links=dict(links), node_links={k: v for k, v in caps.items() if v != NodeLinkSpec()},
                          blocked=frozenset(blocked))
        timeline.append(TimedState(float(change.get("at_s", 0.0)), str(change.get("label", "")), state))
    actions = [Action(float(c["at_s"]), str(c["kind"]), tuple(int(x) for x in c.get("nodes", [])),
                      label=str(c.get("label", c["kind"])))
               for c in record.get("churn", [])]
    return timeline, actions
