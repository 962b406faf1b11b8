"""Probe job results -> what each directed link was seen to do (pure; no Docker here).

A UDP probe of the pair ``(s, d)`` crosses two links: its datagrams cross ``s -> d`` and the echoes
cross ``d -> s``. The probe job reports, at the prober, what it sent and which echoes came back
(with the send, server-receive and receive stamps), and at the server, which distinct sequence
numbers arrived. Hence, per link:

* ``s -> d``: ``sent - unsent`` datagrams entered, ``sent - unsent - received`` were lost; forward
  legs are delays.
* ``d -> s``: ``received - unechoed`` echoes entered, ``received - unechoed - replies`` were lost;
  return legs are delays.

``unsent`` and ``unechoed`` are sends the sender's kernel refused (a full buffer): they never
entered the link. A datagram the receiver's kernel dropped because its socket's receive buffer was
full (``rx_dropped``, per socket) did cross the link, but a socket serves every peer, so such drops
bound the link's own loss from below instead of being subtracted: ``host_dropped``.

One-way legs are differences of stamps from two containers, valid only when both read the same
``CLOCK_MONOTONIC`` (same kernel boot, same time namespace: every node reports its ``clock``).
Without that, only round trips are used.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from squall.calibration.stats import Moments, pool

Link = tuple[int, int]
NEGATIVE_LEG_US = -200.0  # a leg below this means the clocks are not shared after all


@dataclass(frozen=True)
class LinkObservation:
    """What the UDP probes saw on one directed link."""

    link: Link  # (src, dst)
    one_way: Moments | None  # pooled one-way delays in microseconds; None without a shared clock
    packets: int  # datagrams that entered the link
    lost: int  # of those, never delivered
    one_way_samples: tuple[float, ...] = ()  # every one-way delay, when the probe sent them (raw)
    host_dropped: int = 0  # at most this many of ``lost`` were dropped by the receiver's full socket buffers


@dataclass(frozen=True)
class RoundTrip:
    """Round trips of one prober to one target."""

    pair: Link  # (prober, target)
    rtt: Moments | None  # round-trip times in microseconds
    sent: int  # probes whose probe and echo both left their sender (0 for TCP round trips)
    replies: int  # distinct replies received
    rtt_samples: tuple[float, ...] = ()  # every round trip, when the probe sent them (raw)
    host_dropped: int = 0  # at most this many of the missing replies were dropped by full socket buffers


@dataclass(frozen=True)
class UdpObservation:
    """Everything one ``udp_probe`` run showed."""

    links: Mapping[Link, LinkObservation]  # per directed link that some probe crossed
    round_trips: Mapping[Link, RoundTrip]  # per probed pair
    shared_clock: bool  # one-way delays are valid
    problems: tuple[str, ...]  # what made some data unusable (failed nodes, late servers)


@dataclass(frozen=True)
class TransferObservation:
    """One bulk transfer, measured at its receiver."""

    link: Link  # (sender, receiver)
    goodput_bps: float | None  # TCP payload bits per second in the measured window
    mss: int | None  # TCP segment size (payload bytes per frame)
    window_s: float | None  # length of the measured window
    error: str | None  # why there is no measurement


def shared_clock(values: Mapping[int, Mapping[str, Any]]) -> bool:
    """Whether every node reported the same, known monotonic clock."""
    clocks = [v.get("clock") for v in values.values()]
    if not clocks or any(not c or not c.get("boot_id") for c in clocks):
        return False
    return all(c == clocks[0] for c in clocks)


def _late_nodes(values: Mapping[int, Mapping[str, Any]], problems: list[str]) -> set[int]:
    late = set()
    for node, v in values.items():
        behind = float(v.get("server_up_wall", 0.0)) - float(v.get("start_wall", 0.0))
        if behind > 0:
            late.add(node)
            problems.append(f"node {node}'s echo server came up {behind:.3f} s after the probes started")
    return late


class _Accumulator:
    """Delays and packet counts per directed link, gathered pair by pair."""

    def __init__(self) -> None:
        self.legs: dict[Link, list[Moments | None]] = defaultdict(list)
        self.samples: dict[Link, list[float]] = defaultdict(list)
        self.counts: dict[Link, tuple[int, int]] = {}
        self.drops: dict[Link, dict[str, int]] = defaultdict(dict)  # per socket of the link's receiving node

    def add_delays(self, pair: Link, target: Mapping[str, Any], rows: Sequence[Sample]) -> None:
        there, back = pair, (pair[1], pair[0])
        if rows:
            self.samples[there] += [r.forward_us for r in rows]
            self.samples[back] += [r.back_us for r in rows]
        else:
            self.legs[there].append(Moments.from_summary(target.get("fwd_us")))
            self.legs[back].append(Moments.from_summary(target.get("rev_us")))

    def add_counts(self, link: Link, packets: int, lost: int, sock: str, dropped: int) -> None:
        """``packets`` entered ``link`` and ``lost`` of them never arrived at the ``sock`` socket of its
        receiving node, whose full receive buffer dropped ``dropped`` datagrams (counted once per socket)."""
        old = self.counts.get(link, (0, 0))
        self.counts[link] = (old[0] + packets, old[1] + lost)
        self.drops[link][sock] = dropped

    def dropped(self, link: Link) -> int:
        return sum(self.drops.get(link, {}).values())

    def links(self, clock: bool) -> dict[Link, LinkObservation]:
        out: dict[Link, LinkObservation] = {}
        for link in set(self.legs) | set(self.counts):
            packets, lost = self.counts.get(link, (0, 0))
            if clock:
                out[link] = LinkObservation(link, pool(self.legs.get(link, [])), packets, lost,
                                            tuple(self.samples.get(link, ())), self.dropped(link))
            else:
                out[link] = LinkObservation(link, None, packets, lost, host_dropped=self.dropped(link))
        return out


def parse_udp(values: Mapping[int, Mapping[str, Any] | None], pairs: Sequence[Link],
              raw: Mapping[Link, Sequence[Sample]] | None = None) -> UdpObservation:
    """Per-link observations from the ``udp_probe`` values of every node (None: the node failed).

    With ``raw`` (from :func:`raw_samples`) delays are computed from every sample and kept;
    otherwise from the probes' summaries.
    """
    problems = [f"node {n}: the probe job failed" for n, v in sorted(values.items()) if v is None]
    good = {n: v for n, v in values.items() if v is not None}
    late = _late_nodes(good, problems)
    acc = _Accumulator()
    trips: dict[Link, RoundTrip] = {}
    for s, d in pairs:
        target = good.get(s, {}).get("targets", {}).get(str(d))
        if target is None:
            continue
        rows = list((raw or {}).get((s, d), ()))
        rtts = tuple(r.rtt_us for r in rows)
        source = good.get(d, {}).get("sources", {}).get(str(s))
        sent = int(target["sent"]) - int(target.get("unsent", 0))  # probes that entered s -> d
        unechoed = int((source or {}).get("unechoed", 0))
        at_d, at_s = _rx_dropped(good.get(d), "server"), _rx_dropped(good.get(s), "client")
        trips[(s, d)] = RoundTrip((s, d), Moments.of(rtts) if rows else Moments.from_summary(target.get("rtt_us")),
                                  sent - unechoed, int(target["replies"]), rtts, at_d + at_s)
        acc.add_delays((s, d), target, rows)
        if source is not None and not late & {s, d}:
            received, replies = int(source["received"]), int(target["replies"])
            acc.add_counts((s, d), sent, sent - received, "server", at_d)  # the probes
            acc.add_counts((d, s), received - unechoed, received - unechoed - replies, "client", at_s)  # echoes
    for link, values_us in acc.samples.items():
        acc.legs[link].append(Moments.of(values_us))
    clock = shared_clock(good) and not _negative_legs(acc.legs, problems)
    return UdpObservation(acc.links(clock), trips, clock, tuple(problems))


def _rx_dropped(value: Mapping[str, Any] | None, sock: str) -> int:
    """What one node's ``server`` or ``client`` socket dropped on arrival (a full receive buffer)."""
    return int(((value or {}).get("rx_dropped") or {}).get(sock, 0))


def _negative_legs(legs: Mapping[Link, list[Moments | None]], problems: list[str]) -> bool:
    for link, parts in legs.items():
        pooled = pool(parts)
        if pooled is not None and pooled.mean < NEGATIVE_LEG_US:
            problems.append(f"link {link[0]}->{link[1]}: one-way delay {pooled.mean:.0f} us < 0, "
                            "the clocks are not shared; using round trips")
            return True
    return False


def parse_tcp(values: Mapping[int, Mapping[str, Any] | None],
              transfers: Sequence[Link]) -> dict[Link, TransferObservation]:
    """One observation per scheduled transfer (by index) from the ``tcp_goodput`` values of every node."""
    received: dict[int, Mapping[str, Any]] = {}
    mss_sent: dict[int, int] = {}
    for v in values.values():
        for r in (v or {}).get("received", []):
            received[int(r["index"])] = r
        for s in (v or {}).get("sent", []):
            mss_sent[int(s["index"])] = int(s.get("mss") or 0)
    out: dict[Link, TransferObservation] = {}
    for index, (src, dst) in enumerate(transfers):
        r = received.get(index)
        if values.get(dst) is None:
            out[(src, dst)] = TransferObservation((src, dst), None, None, None, f"the job failed on receiver {dst}")
        elif r is None or r.get("goodput_bps") is None:
            error = (r or {}).get("error") or "the receiver saw no transfer"
            out[(src, dst)] = TransferObservation((src, dst), None, None, None, str(error))
        else:
            mss = mss_sent.get(index) or int(r.get("mss") or 0) or None
            out[(src, dst)] = TransferObservation((src, dst), float(r["goodput_bps"]), mss, float(r["window_s"]), None)
    return out


def parse_tcp_rtt(values: Mapping[int, Mapping[str, Any] | None], pairs: Sequence[Link]) -> dict[Link, RoundTrip]:
    """Round trips from the ``tcp_rtt`` values (pairs whose prober failed are left out)."""
    out: dict[Link, RoundTrip] = {}
    for s, d in pairs:
        target = (values.get(s) or {}).get("targets", {}).get(str(d))
        if target and "rtt_us" in target:
            moments = Moments.from_summary(target["rtt_us"])
            out[(s, d)] = RoundTrip((s, d), moments, 0, moments.count if moments else 0)
    return out


@dataclass(frozen=True)
class Sample:
    """One answered UDP probe, for time series (phase changes)."""

    seq: int  # sequence number
    send_wall: float  # wall-clock send time, seconds
    forward_us: float  # prober -> target leg
    back_us: float  # target -> prober leg
    rtt_us: float  # round trip


def raw_samples(records: Sequence[Mapping[str, Any]]) -> dict[Link, list[Sample]]:
    """Answered probes per pair from the ``udp_raw`` metrics records of ``udp_probe`` with ``raw``."""
    out: dict[Link, list[Sample]] = {}
    for rec in records:
        if rec.get("kind") != "udp_raw":
            continue
        offset = int(rec["wall_offset_ns"])
        rows = zip(rec["seq"], rec["send_ns"], rec["server_ns"], rec["recv_ns"], strict=True)
        out[(int(rec["src"]), int(rec["dst"]))] = [
            Sample(seq, (s + offset) / 1e9, (v - s) / 1e3, (r - v) / 1e3, (r - s) / 1e3) for seq, s, v, r in rows]
    return out


def better(first: TransferObservation, second: TransferObservation | None) -> TransferObservation:
    """The higher of two measurements of one link (a failed one never wins over a measured one)."""
    if second is None or second.goodput_bps is None:
        return first
    if first.goodput_bps is None or second.goodput_bps > first.goodput_bps:
        return second
    return first
