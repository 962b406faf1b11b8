"""Run the probe jobs of :mod:`squall.calibration.probes` on a cluster and parse what they return.

Every probe starts at a common wall-clock time a little in the future (``lead``), so that all
echo servers are up before the first datagram; a node that came up late is detected from its own
report and the UDP probe is run once more with twice the lead.

The UDP probe, which measures delays to the tenth of a millisecond, runs as real-time processes
the host starts inside the nodes' namespaces (:mod:`squall.calibration.hostprobe`) wherever it can
(root; a cluster may say ``host_probes = False``), so that CPU-bound neighbours do not read as delay;
otherwise, and for the TCP jobs, the nodes' agents run them.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from squall.calibration import hostprobe
from squall.calibration.observations import (
    Link,
    RoundTrip,
    TransferObservation,
    UdpObservation,
    parse_tcp,
    parse_tcp_rtt,
    parse_udp,
    raw_samples,
)
from squall.calibration.plan import TransferPlan
from squall.cluster import JobResult
from squall.cluster.backend import ClusterBackend

logger = logging.getLogger(__name__)

LEAD_S = 1.0  # common start this far after dispatch (plus 50 ms per node)
SLACK_S = 15.0  # job timeout beyond the probe's own schedule


def _lead(cluster: ClusterBackend, factor: float = 1.0) -> float:
    return factor * (LEAD_S + 0.05 * len(cluster.nodes))


def _values(results: Sequence[JobResult]) -> dict[int, Mapping[str, Any] | None]:
    values: dict[int, Mapping[str, Any] | None] = {}
    for r in results:
        if r.ok and isinstance(r.value, dict):
            values[r.node] = r.value
        else:
            logger.warning("probe job failed: %s", r.describe())
            values[r.node] = None
    return values


def run_udp(cluster: ClusterBackend, links: Sequence[Link], *, count: int, rate_pps: float, wait_s: float,
            raw: bool = True, punch: Sequence[Link] = ()) -> tuple[UdpObservation, list[JobResult]]:
    """UDP echo probe of ``links`` (each probed by its source); returns the parsed view and the job results.

    With ``raw`` (the default) every answered probe comes back, so delays keep their samples. A
    node whose echo server came up after the start is noticed, and the probe is run once more with
    twice the lead.
    """
    obs, results = finish_udp(start_udp(cluster, links, count=count, rate_pps=rate_pps, wait_s=wait_s, raw=raw,
                                        punch=punch), links)
    if any("came up" in p for p in obs.problems):
        logger.warning("UDP probe: %s; probing again with a longer lead", "; ".join(obs.problems))
        handle = start_udp(cluster, links, count=count, rate_pps=rate_pps, wait_s=wait_s, raw=raw,
                           lead_s=_lead(cluster, 2.0), punch=punch)
        obs, results = finish_udp(handle, links)
    return obs, results


class Waitable(Protocol):
    """A job under way on every node: the agents' :class:`JobHandle` or a :class:`hostprobe.HostJobHandle`."""

    def wait(self, *, raise_on_failure: bool = True) -> list[JobResult]: ...


def host_probes(cluster: ClusterBackend) -> bool:
    """Whether the host runs this cluster's UDP probes itself (real-time, in the nodes' namespaces)."""
    if not getattr(cluster, "host_probes", True) or getattr(cluster, "engine", "local") != "local":
        return False  # a swarm's namespaces are on other machines
    why = hostprobe.unavailable(cluster.endpoints())
    if why:
        logger.info("UDP probes run by the nodes' agents: the host cannot run them (%s)", why)
    return why is None


@dataclass(frozen=True)
class UdpRun:
    """A UDP probe under way."""

    handle: Waitable  # the job on every node
    start_wall: float  # wall-clock time of the first probe
    raw: bool  # every answered probe will come back


def start_udp(cluster: ClusterBackend, links: Sequence[Link], *, count: int, rate_pps: float, wait_s: float,
              raw: bool = True, lead_s: float | None = None, punch: Sequence[Link] = ()) -> UdpRun:
    """Start the UDP probe and return at once (to change the shaping while it runs).

    :param punch: links into a NAT their source cannot open (the target opens the way, see the probes).
    """
    config: dict[str, Any] = {"pairs": [list(link) for link in links], "count": count, "rate_pps": rate_pps,
                              "wait_s": wait_s, "raw": raw}
    if punch:
        config["punch"] = [list(link) for link in punch]
    lead = _lead(cluster) if lead_s is None else lead_s
    start = time.time() + lead
    timeout = lead + count / rate_pps + wait_s + SLACK_S
    if host_probes(cluster):
        return UdpRun(hostprobe.start(cluster.endpoints(), "udp_probe", config, start_wall=start, timeout_s=timeout),
                      start, raw)
    config["start_wall"] = start
    return UdpRun(cluster.start_job("udp_probe", config, timeout=timeout), start, raw)


def finish_udp(run: UdpRun, links: Sequence[Link]) -> tuple[UdpObservation, list[JobResult]]:
    """Wait for a started UDP probe and parse it."""
    results = run.handle.wait(raise_on_failure=False)
    raw = raw_samples([m for r in results if r.ok for m in r.metrics()]) if run.raw else None
    return parse_udp(_values(results), links, raw), results


def run_tcp(cluster: ClusterBackend, transfers: Sequence[TransferPlan]) -> dict[Link, TransferObservation]:
    """The bulk transfers of ``transfers``, on their schedule; one observation per transfer."""
    if not transfers:
        return {}
    lead = _lead(cluster)
    config = {"transfers": [t.to_config() for t in transfers], "start_wall": time.time() + lead}
    timeout = lead + max(t.at_s + t.seconds for t in transfers) + SLACK_S
    results = cluster.run_job("tcp_goodput", config, timeout=timeout, raise_on_failure=False)
    return parse_tcp(_values(results), [t.link for t in transfers])


def run_tcp_rtt(cluster: ClusterBackend, links: Sequence[Link], *, count: int = 100,
                interval_s: float = 0.01) -> dict[Link, RoundTrip]:
    """TCP request/response round trips of ``links`` (the fallback when UDP gave nothing)."""
    lead = _lead(cluster)
    per_prober = max(sum(1 for s, _ in links if s == node) for node in range(len(cluster.nodes)))
    span = per_prober * count * (interval_s + 0.25)
    start = time.time() + lead
    config = {"pairs": [list(link) for link in links], "count": count, "interval_s": interval_s,
              "start_wall": start, "stop_wall": start + span + 2.0}
    results = cluster.run_job("tcp_rtt", config, timeout=lead + span + SLACK_S, raise_on_failure=False)
    return parse_tcp_rtt(_values(results), links)
