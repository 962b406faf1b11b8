"""How much to probe, and which links: pure sizing of a calibration run from a :class:`LinkState`.

Budget (2 host cores run every container, the shaping daemon and the probes):

* **UDP**: every checked link ``(s, d)`` is probed by ``s`` at :data:`UDP_RATE_PPS` (500/s, 64-byte
  datagrams), all pairs at once: 12 pairs make 6000 probes and 6000 echoes per second, a few % of
  a core in the daemon. When both directions of a pair are checked, each link carries probes and
  echoes, so it sees about ``(2 - p_back) * count`` packets (echoes cross the reverse link
  first). ``count`` is the largest need over the links, with 5 % to spare:
  :func:`~squall.calibration.verdicts.loss_packets_needed` at the per-check confidence (see
  below), and :data:`MIN_COUNT` for the delay and jitter checks (1 000 samples give the s.d. check
  a false-failure probability of 1e-9 and the mean check 1e-6 or less for the shipped profiles),
  capped at :data:`MAX_COUNT` (20 s). A link that would need more gets an ``unknown`` loss row.
* **Per-check confidence**: the loss checks of one run share a 1 % false-failure budget (Sidak:
  ``1 - 0.99^(1/L)`` each for L checked links), so that a correct backend passes a whole
  calibration with probability >= 99 %, not only each link.
* **TCP**: one transfer per checked link with a rate, one at a time (transfers would otherwise
  compete for the cores, not for the links). Warm-up covers slow start to the bandwidth-delay
  product (``RTT * (log2(BDP / 10 segments) + 3)``, at least 0.3 s), then a 1 s window (0.5 s
  quick). Transfers run with loss and jitter switched off (TCP cannot fill a lossy pipe: Mathis'
  bound gives 11.6 Mbit/s at 1 % loss and 10 ms RTT), with every delay kept. A transfer that
  falls short of its rate is measured once more and the better result counts: a rate limit is an
  upper bound, and a host stall can only lower a measurement, never lift it over the limit.
* **Shared uplinks**: a node with an ``uplink`` cap also sends to every peer at once (one
  transfer per peer, all started together, :data:`MAX_UPLINKS` nodes at most, one per distinct
  cap first), so the check sees the cap shared: the peers' rates add up to the uplink, not each
  reaching it. Each transfer alone, above, only sees the tightest cap of its own link.
* **Sampling**: above :data:`MAX_LINKS` directed links (n > 4), unordered pairs are chosen so
  that each distinct pair of settings (forward spec, backward spec, node caps) is covered at least
  once, then filled with a seeded random choice; both directions of a chosen pair are checked.
  ``pairs`` overrides the choice.

``quick`` halves the resolution asked of the loss check (the acceptance region may span +-100 %
of the mean loss, a quarter of the packets), probes at least 500 times instead of 1 000 and
shortens the TCP window to 0.5 s.
"""

from __future__ import annotations

import dataclasses
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

from squall.calibration.expected import delay_model, link_rate_bps, loss_model
from squall.calibration.stats import sidak
from squall.calibration.verdicts import LOSS_RESOLUTION, loss_packets_needed
from squall.shaping.base import LinkState

Link = tuple[int, int]
UDP_RATE_PPS = 500.0  # probes per second per checked link
MAX_UDP_PPS = 6000.0  # all probes together (echoes double it)
MIN_COUNT = 1000  # probes per pair at least
QUICK_MIN_COUNT = 500  # ... with quick
MAX_COUNT = 10000  # probes per pair at most
BASELINE_COUNT = 300  # probes per pair on the unshaped cluster
MAX_LINKS = 12  # directed links checked when the caller names none
COUNT_MARGIN = 1.05  # more probes than the loss check needs: the echoes that arrive vary
FAMILY_ALPHA = 0.01  # false-failure budget of all loss checks of a run together
MSS_BYTES = 1448  # for the slow-start estimate
GAP_S = 0.4  # between transfers, plus one RTT
MAX_UPLINKS = 2  # nodes whose shared uplink is measured by sending to every peer at once
WINDOW_S = 1.0  # measured part of a transfer
QUICK_WINDOW_S = 0.5


@dataclass(frozen=True)
class TransferPlan:
    """One scheduled bulk transfer."""

    link: Link  # (sender, receiver)
    at_s: float  # start after the common start time
    seconds: float  # from the receiver's first byte to the end of its window
    warmup_s: float  # not counted
    slot_s: float = 0.0  # time it holds in a schedule: seconds + gap + one round trip
    dial_back: bool = False  # the receiver is behind a NAT the sender cannot open: it opens the connection

    def to_config(self) -> dict[str, object]:
        """The entry of ``tcp_goodput``'s ``transfers``."""
        config: dict[str, object] = {"src": self.link[0], "dst": self.link[1], "at_s": round(self.at_s, 3),
                                     "seconds": round(self.seconds, 3), "warmup_s": round(self.warmup_s, 3)}
        if self.dial_back:
            config["dial_back"] = True
        return config


@dataclass(frozen=True)
class ProbePlan:
    """What one calibration run will measure."""

    links: tuple[Link, ...]  # directed links checked (and probed by their source)
    udp_count: int  # probes per link
    udp_rate_pps: float  # probes per second per link
    udp_wait_s: float  # replies still counted this long after the last probe
    baseline_count: int  # probes per link on the unshaped cluster
    loss_confidence: float  # confidence of each loss check
    transfers: tuple[TransferPlan, ...]  # bulk transfers, one at a time
    notes: tuple[str, ...]  # sampling and budget decisions, for the report
    loss_resolution: float = LOSS_RESOLUTION  # half-width of the loss acceptance region over the mean it asks for
    uplinks: tuple[tuple[TransferPlan, ...], ...] = ()  # per node with an uplink cap: to every peer at once
    punch: tuple[Link, ...] = ()  # checked links into a NAT their source cannot open: the receiver opens them

    @property
    def udp_seconds(self) -> float:
        """Length of the shaped UDP probe."""
        return self.udp_count / self.udp_rate_pps + self.udp_wait_s

    @property
    def tcp_seconds(self) -> float:
        """Length of the transfer schedule, the shared uplinks' transfers included."""
        alone = max((t.at_s + t.seconds for t in self.transfers), default=0.0)
        return alone + sum(max(t.slot_s for t in group) for group in self.uplinks)


def plan_probes(state: LinkState, n: int, *, pairs: Sequence[Link] | None = None, quick: bool = False,
                max_links: int = MAX_LINKS, seed: int = 0) -> ProbePlan:
    """Choose links, probe sizes and the transfer schedule for ``state`` on ``n`` nodes."""
    notes: list[str] = []
    links = _chosen(state, n, pairs, max_links=max_links, seed=seed, notes=notes)
    closed = [link for link in links if not state.reachable(*link) and not state.reachable(link[1], link[0])]
    if closed:  # named pairs only: the links chosen here are never closed
        raise ValueError(f"pair {closed[0][0]} -> {closed[0][1]}: both nodes are behind NATs of different sites, "
                         "so neither can open a connection to the other and the link carries nothing")
    alpha = sidak(FAMILY_ALPHA, len(links))
    confidence = 1.0 - alpha
    rate = min(UDP_RATE_PPS, MAX_UDP_PPS / len(links))
    resolution = _loss_resolution(quick)
    count = _udp_count(state, links, confidence, resolution, quick=quick, notes=notes)
    wait = _wait_s(state, links)
    transfers = _schedule(state, links, QUICK_WINDOW_S if quick else WINDOW_S)
    uplinks = fan_outs(state, n, links, QUICK_WINDOW_S if quick else WINDOW_S)
    if uplinks:
        notes.append("shared uplink of node(s) " + ", ".join(str(g[0].link[0]) for g in uplinks)
                     + ": sent to every peer at once")
    notes.append(f"loss checks at {confidence:.5f} each ({len(links)} links share a {FAMILY_ALPHA:.0%} "
                 "false-failure budget)")
    unchecked = sorted({key for link in links for key, chance in (("duplication", state.links[link].duplicate),
                                                                   ("reordering", state.links[link].reorder))
                        if chance.probability > 0})
    if unchecked:
        notes.append(f"{' and '.join(unchecked)} configured but not checked")
    punch = tuple(link for link in links if not state.reachable(*link))
    if punch:
        notes.append(f"{len(punch)} link(s) into a NAT: the node behind it opens the probes' and transfers' way")
    return ProbePlan(tuple(links), count, rate, wait, min(BASELINE_COUNT, count), confidence, tuple(transfers),
                     tuple(notes), resolution, uplinks, punch)


def _chosen(state: LinkState, n: int, pairs: Sequence[Link] | None, *, max_links: int, seed: int,
            notes: list[str]) -> list[Link]:
    if pairs is not None:
        chosen = list(dict.fromkeys((int(s), int(d)) for s, d in pairs))
        for s, d in chosen:
            if s == d or not (0 <= s < n and 0 <= d < n):
                raise ValueError(f"pair {s} -> {d} is not a link of a {n}-node cluster")
        if not chosen:
            raise ValueError("pairs is empty: name at least one directed link")
        return chosen
    every = [(s, d) for s in range(n) for d in range(n) if s != d and (state.reachable(s, d) or state.reachable(d, s))]
    if len(every) < n * (n - 1):
        notes.append(f"left out {n * (n - 1) - len(every)} link(s) between nodes behind different NATs "
                     "(they carry nothing)")
    if not every:
        raise ValueError(f"a cluster of {n} node(s) has no links to check")
    if len(every) <= max_links:
        return every
    unordered = [(a, b) for a in range(n) for b in range(a + 1, n) if state.reachable(a, b) or state.reachable(b, a)]
    classes: dict[object, Link] = {}
    for a, b in unordered:
        key = (state.links[(a, b)], state.links[(b, a)], state.node_links.get(a), state.node_links.get(b),
               state.reachable(a, b), state.reachable(b, a))  # a way into a NAT is a kind of its own
        classes.setdefault(key, (a, b))
    picked = list(classes.values())[: max(1, max_links // 2)]
    rest = [p for p in unordered if p not in picked]
    random.Random(seed).shuffle(rest)
    picked += rest[: max(0, max_links // 2 - len(picked))]
    notes.append(f"sampled {2 * len(picked)} of {len(every)} links: every distinct setting "
                 f"({len(classes)} kinds of pair) first, then seeded at random (seed {seed})")
    return sorted({link for a, b in picked for link in ((a, b), (b, a))})


def _loss_resolution(quick: bool) -> float:
    """What the loss checks ask of the count: the plan sizes the probe for it and the judge checks it."""
    return 2 * LOSS_RESOLUTION if quick else LOSS_RESOLUTION


def _udp_count(state: LinkState, links: list[Link], confidence: float, resolution: float, *, quick: bool,
               notes: list[str]) -> int:
    checked = set(links)
    need = QUICK_MIN_COUNT if quick else MIN_COUNT
    for s, d in links:
        needed = loss_packets_needed(loss_model(state.links[(s, d)].loss), confidence, resolution)
        # Own probes, plus the echoes of the reverse probe: those that survived the reverse link.
        echoes = 1.0 - loss_model(state.links[(d, s)].loss).mean if (d, s) in checked else 0.0
        need = max(need, math.ceil(COUNT_MARGIN * needed / (1.0 + echoes)))
    if need > MAX_COUNT:
        notes.append(f"loss needs {need} probes per link; capped at {MAX_COUNT} (its check may be unknown)")
    return min(need, MAX_COUNT)


def _wait_s(state: LinkState, links: list[Link]) -> float:
    """Replies are counted up to the slowest round trip's mean + 6 s.d., plus 0.5 s."""
    worst = 0.0
    for s, d in links:
        there, back = delay_model(state.links[(s, d)]), delay_model(state.links[(d, s)])
        worst = max(worst, there.mean_us + back.mean_us + 6 * math.hypot(there.sd_us, back.sd_us))
    return round(worst / 1e6 + 0.5, 3)


def _schedule(state: LinkState, links: list[Link], window_s: float) -> list[TransferPlan]:
    plans: list[TransferPlan] = []
    at = 0.0
    for s, d in links:
        rate = link_rate_bps(s, d, state.links[(s, d)], state.node_links)
        if rate is None or (s, d) in state.blocked:
            continue
        rtt = (state.links[(s, d)].delay_us + state.links[(d, s)].delay_us) / 1e6
        bdp_segments = rate / 8 * rtt / MSS_BYTES
        warmup = max(0.3, rtt * (math.log2(max(1.0, bdp_segments / 10)) + 3))
        slot = warmup + window_s + GAP_S + rtt
        plans.append(TransferPlan((s, d), at, warmup + window_s, warmup, slot, dial_back=not state.reachable(s, d)))
        at += slot
    return plans


def fan_outs(state: LinkState, n: int, links: Sequence[Link], window_s: float) -> tuple[tuple[TransferPlan, ...], ...]:
    """For nodes with an uplink cap (senders of checked links first, one per distinct cap, at most
    :data:`MAX_UPLINKS`) and two peers or more to reach: a transfer to each peer, all starting at 0
    with the longest warm-up of them."""
    groups: list[tuple[TransferPlan, ...]] = []
    caps = set()
    for node in dict.fromkeys([s for s, _ in links] + list(range(n))):
        cap = state.node_links.get(node)
        if cap is None or cap.uplink_bps is None or cap in caps or len(groups) == MAX_UPLINKS:
            continue
        peers = [(node, d) for d in range(n) if d != node and (state.reachable(node, d) or state.reachable(d, node))]
        alone = _schedule(state, peers, window_s)  # blocked links left out
        if len(alone) < 2:
            continue
        caps.add(cap)
        warmup = max(t.warmup_s for t in alone)
        groups.append(tuple(TransferPlan(t.link, 0.0, warmup + window_s, warmup, warmup + window_s + GAP_S,
                                         dial_back=t.dial_back) for t in alone))
    return tuple(groups)


def fan_out_rate_bps(state: LinkState, group: Sequence[TransferPlan]) -> int:
    """What a node of :func:`fan_outs` may send to every peer at once in total: its uplink, or less
    when the peers' own links (their rates, the receivers' downlinks) add up to less."""
    uplink = state.node_links[group[0].link[0]].uplink_bps
    assert uplink is not None  # fan_outs plans only nodes with an uplink cap
    return min(uplink, sum(link_rate_bps(s, d, state.links[(s, d)], state.node_links) or uplink
                           for s, d in (t.link for t in group)))


def reschedule(transfers: Sequence[TransferPlan]) -> tuple[TransferPlan, ...]:
    """The same transfers back to back from time 0 (to measure a few of them again)."""
    out: list[TransferPlan] = []
    at = 0.0
    for t in transfers:
        out.append(dataclasses.replace(t, at_s=at))
        at += t.slot_s or t.seconds + GAP_S
    return tuple(out)
