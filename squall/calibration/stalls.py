"""Host stalls: what one is, how it is counted, and when it leaves a measurement unknown.

A shared host stops running a process now and then for milliseconds (a small VM's virtual CPUs
are descheduled; other work loads both cores). A probe, an echo server or a userspace shaper
stalled so holds every packet it has in hand: those packets arrive late whatever the link does.
A link and a stalled host cannot be told apart packet by packet, so the policy is:

* **What a stall is.** A delay farther from the median of its sample than the window
  :meth:`StallPolicy.window_us`: ``max(6 sd, 1 ms)``, ``sd`` the link's configured jitter. The
  configured law puts (almost) nothing that far out (uniform: nothing; normal: 2e-9), so the window
  keeps the law whole and its mean unbiased, and what lies beyond is the host's. Heavy-tailed laws
  (Pareto) have no such window: their far samples are the law's, and nothing is left out.
* **How it is counted.** :func:`without_stalls`: the moments of the samples inside the window and
  how many lay beyond. A probe's stalled share is the largest such share among its links: stalls
  hit every link of a probe alike, and show plainly on links without wide jitter.
* **When a verdict is unknown** (never passed: the host was too busy to judge). A host that stalls
  often is late with every packet, not only the far ones, so past :attr:`StallPolicy.judge_share`
  of a probe a delay or jitter check is unknown, and a short rate transfer too. A link whose window
  is wider than the floor keeps the stalls that land inside its own law, where nothing tells them
  apart, so it is judged only up to :attr:`StallPolicy.hidden_share`. Past
  :attr:`StallPolicy.probe_share` a probe as a whole cannot be used: stalls are one-sided, so they
  move the median to the law's ``0.5 / (1 - f)`` quantile, 0.43 s.d. of a normal law at f = 25 %,
  still inside the law's core, where the window still holds the whole law.
* **How many tries.** A probe whose share is above :attr:`StallPolicy.retry_share` is probed again,
  up to :attr:`StallPolicy.tries` in all, and the least stalled try is kept. A try is chosen by its
  stalls only, never by its verdicts: a busy moment passes, a wrong link does not turn into stalls.
* **The canary.** Measurements without per-packet delays (a transfer's rate, a test's timing) are
  watched by a real-time thread that sleeps 1 ms over and over (``tests/timing.py``); nothing of
  the code under test runs in it, so its lateness is the host's alone. Late by more than
  :attr:`StallPolicy.canary_p99_us` at the 99th percentile (the delay checks' own 0.5 ms
  tolerance), the host stalled as much as a check tolerates, and a failure beside it says nothing.
* **A noisier path.** The policy above is for a host whose own packet path is quiet (tens of
  microseconds). Where the path itself spreads by a good part of a millisecond (the netem VM's
  emulated CPUs), :meth:`StallPolicy.on_path` scales the window, the tolerance floors and the shares
  to that path's measured spread and tail, and :meth:`StallPolicy.with_canary` the canary's bound to
  the idle canary's own lateness. A wrong delay still moves the median of every sample, stalled or
  not, by its whole error, so the scaled checks still see it.

The policy is a value, never state: whoever starts a calibration builds one (:data:`HOST` on a
quiet host; :meth:`StallPolicy.on_path` or :meth:`StallPolicy.with_canary` of it where a noisier
path was measured) and passes it to every judge it calls (:mod:`.verdicts`, :mod:`.judge`,
:mod:`.segments`, the runner's retries), so a row is judged by the policy its caller named.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

from squall.calibration.stats import Moments

#: On a noisier path (:meth:`StallPolicy.on_path`): the stall window is at least this many s.d. of the
#: path (as a configured jitter of that s.d. would get), the delay tolerance at least this many...
PATH_WINDOW_SIGMAS = 6.0
PATH_DELAY_SIGMAS = 3.0
#: ... and the jitter tolerance at least this many (a delayed packet waits for a timer, so a shaped
#: link spreads more than the unshaped path it is measured against).
PATH_JITTER_SIGMAS = 2.0
#: The canary's bound on a slower host: this many times the idle canary's own p99 lateness.
CANARY_FACTOR = 3.0


@dataclass(frozen=True)
class StallPolicy:
    """The bounds of the host-stall policy (the module docstring says why each is what it is)."""

    sigmas: float = 6.0  # a delay this many configured s.d. from the median is a stall...
    floor_us: float = 1000.0  # ... and at least this far
    judge_share: float = 0.10  # more of a probe stalled: its delay, jitter and short rate rows are unknown
    hidden_share: float = 0.05  # ... the same for a link whose window is wider than the floor
    probe_share: float = 0.25  # more of a probe stalled: the probe as a whole cannot be used
    retry_share: float = 0.10  # more of a probe stalled: it is probed again (not raised on a noisier path:
    # a try costs only time, and the least stalled one is kept)
    tries: int = 3  # probes at most, the first included
    canary_p99_us: float = 500.0  # the canary woke later than this at its p99: the host stalled
    delay_floor_us: float = 500.0  # the delay tolerance never goes below this ...
    jitter_floor_us: float = 250.0  # ... nor the jitter tolerance below this: a quiet path's own spread
    path_sd_us: float = 0.0  # the unshaped path's measured s.d. the bounds were scaled to (0: not scaled)
    path_tail: float = 0.0  # the unshaped path's own share beyond the window (0: not scaled)

    def window_us(self, sd_us: float) -> float:
        """How far from the median a delay of a link with configured jitter ``sd_us`` may lie before it
        counts as a host stall."""
        return max(self.sigmas * sd_us, self.floor_us)

    def limit(self, sd_us: float) -> float:
        """The share of a probe the host may stall before the delay and jitter of a link with configured
        jitter ``sd_us`` cannot be judged: :attr:`hidden_share` for a link whose window is wider than the
        floor (it keeps the stalls inside its law), else :attr:`judge_share`."""
        wide = self.window_us(sd_us) > self.floor_us
        return min(self.hidden_share, self.judge_share) if wide else self.judge_share

    def split(self, samples: Sequence[float], sd_us: float) -> tuple[Moments, int]:
        """:func:`without_stalls` with the window of a link with configured jitter ``sd_us``."""
        return without_stalls(samples, self.window_us(sd_us))

    def on_path(self, path_sd_us: float, one_way: Iterable[Sequence[float]]) -> StallPolicy:
        """This policy scaled to a packet path that spreads by ``path_sd_us`` unshaped (its s.d. from the
        quartiles, stalls left out), with ``one_way`` the unshaped probe's delays per link:

        * the window's floor: ``max(floor, 6 s.d.)`` of the path, as a jitter of that s.d. would get;
        * the delay and jitter tolerance floors: ``max(floor, 3 s.d.)`` and ``max(floor, 2 s.d.)``;
        * the judge, hidden and probe shares: raised by the path's own tail, the largest share of one
          link's unshaped delays beyond the new window (measured before anything is shaped, so it is
          the path's and not a link's); :attr:`retry_share` and :attr:`tries` stay.
        """
        floor = max(self.floor_us, PATH_WINDOW_SIGMAS * path_sd_us)
        tail = max((without_stalls(s, floor)[1] / len(s) for s in one_way if s), default=0.0)
        return dataclasses.replace(
            self, floor_us=floor, path_sd_us=path_sd_us, path_tail=tail,
            delay_floor_us=max(self.delay_floor_us, PATH_DELAY_SIGMAS * path_sd_us),
            jitter_floor_us=max(self.jitter_floor_us, PATH_JITTER_SIGMAS * path_sd_us),
            hidden_share=max(self.hidden_share, tail + self.hidden_share),
            judge_share=max(self.judge_share, tail + self.judge_share),
            probe_share=max(self.probe_share, tail + self.probe_share))

    def with_canary(self, idle_p99_us: float) -> StallPolicy:
        """This policy on a host whose idle canary already wakes ``idle_p99_us`` late at its p99 (timers
        emulated in software): the bound is ``max(bound, 3 x idle)``, so a failure beside a canary no
        later than the host's normal is still a failure."""
        return dataclasses.replace(self, canary_p99_us=max(self.canary_p99_us, CANARY_FACTOR * idle_p99_us))

    def to_dict(self) -> dict[str, float]:
        """Plain data for JSON."""
        return dataclasses.asdict(self)


#: The policy of a host whose own packet path is quiet.
HOST = StallPolicy()


def without_stalls(samples: Sequence[float], half_width: float) -> tuple[Moments, int]:
    """Moments of the samples within ``half_width`` of their median, and how many were left out.

    The caller chooses ``half_width`` so wide that the configured law itself puts (almost) nothing
    outside it (:meth:`StallPolicy.window_us`).
    """
    if not samples:
        return Moments(0, float("nan"), float("nan")), 0
    kept = within(samples, half_width)
    return Moments.of(kept), len(samples) - len(kept)


def within(samples: Sequence[float], half_width: float) -> list[float]:
    """The samples within ``half_width`` of their median (stalls left out), in their order."""
    if not samples:
        return []
    median = statistics.median(samples)
    return [v for v in samples if abs(v - median) <= half_width]


#: Every reason of an unknown that the host's stalls caused contains these words (:func:`too_busy`);
#: the test harness skips such an unknown (nothing was judged) and fails any other.
TOO_BUSY = "too busy"


def too_busy(share: float, what: str, limit: float) -> str:
    """The reason a row gives when the host stalled ``share`` of a probe, more than ``limit``."""
    return (f"; the host stalled {100 * share:.1f} % of a link's packets in this probe, more than "
            f"{100 * limit:g} %: the host is {TOO_BUSY} to judge the {what}")
