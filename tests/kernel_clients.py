"""Conformance with clients nobody here wrote: ``ping`` round trips and ``iperf3`` rates between nodes.

The probes of the calibration measure with our own code; these run the stock tools inside the
nodes' network namespaces (``nsenter --net``, the binaries of the machine that runs the tests), so a
user's first sanity check gives the answer the profile promises:

* ``ping`` RTT = the sum of both directions' delays (plus the unshaped RTT measured beside it),
  within ``max(0.5 ms, 5 %)``. The mean is taken without host stalls (samples beyond the stall
  policy's window of a link without jitter, :mod:`squall.calibration.stalls`), as the calibration's
  delay check does; when more than a quiet host's probe share of them are stalls the verdict is
  "unknown: host too busy".
* ``iperf3`` TCP and UDP: the wire rate of what arrived (payload plus headers) within 7 % of the
  link's rate.

Parsing and judging are pure (table-tested in ``tests/unit/test_nfqueue_kernel_clients.py``); running
needs root, ``nsenter``, ``ping`` and ``iperf3``. :func:`require_tools` installs the two tools with
apt where they are missing and apt is there, and otherwise raises with what to install.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import shutil
import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

from squall.calibration import stalls
from squall.calibration.expected import FRAME_OVERHEAD_BYTES
from squall.calibration.stalls import StallPolicy
from squall.checks.verdict import Validity

PING_ABS_US = 500.0  # RTT within max(0.5 ms, 5 %) of both directions' delays
PING_REL = 0.05
RATE_REL = 0.07  # iperf3 rate within 7 % of the link's rate
IPERF_PORT = 5201
UDP_FRAME_OVERHEAD_BYTES = 42  # Ethernet 14 + IPv4 20 + UDP 8
DEFAULT_MSS = 1448  # when a TCP report does not say
TOOLS = {"ping": "iputils-ping", "iperf3": "iperf3", "nsenter": "util-linux"}
_TIME = re.compile(r"\bicmp_seq=(\d+)\b.*\btime=([0-9.]+) ms")


@dataclass(frozen=True)
class Row:
    """One judged check, shaped like the calibration's rows (``tests.timing.judged`` reads it)."""

    link: tuple[int, int]  # (source, destination) node indices
    metric: str  # "ping_rtt", "iperf3_tcp", "iperf3_udp"
    verdict: str  # a calibration row's word: passed, failed or unknown (Validity.past)
    why: str  # the figures behind the verdict


def parse_ping(text: str) -> list[float]:
    """Round-trip times in microseconds, one per reply line of ``ping``'s output (duplicates dropped)."""
    seen: dict[int, float] = {}
    for line in text.splitlines():
        m = _TIME.search(line)
        if m and "DUP!" not in line:
            seen.setdefault(int(m.group(1)), float(m.group(2)) * 1000.0)
    return list(seen.values())


def judge_ping(link: tuple[int, int], rtts_us: list[float], expected_us: float, base_us: float,
               *, sent: int, policy: StallPolicy) -> Row:
    """``ping``'s RTT against the sum of both directions' delays (``expected_us``) plus the unshaped RTT,
    host stalls left out by ``policy``'s window."""
    if len(rtts_us) < sent // 2:
        return Row(link, "ping_rtt", Validity.FAIL.past, f"{len(rtts_us)} of {sent} pings answered")
    kept, stalled = policy.split(rtts_us, 0.0)
    want = expected_us + base_us
    tol = max(PING_ABS_US, PING_REL * expected_us)
    told = (f"ping RTT mean {kept.mean / 1e3:.3f} ms without {stalled} host stalls (n={len(rtts_us)}), expected "
            f"{expected_us / 1e3:.3f} ms of delays + {base_us / 1e3:.3f} ms unshaped = {want / 1e3:.3f} "
            f"+- {tol / 1e3:.3f} ms")
    # A quiet host's bound even where ``policy`` was scaled to a noisier path: that scaling
    # adds the tail of the path's one-way probe delays, which ping's round trips were never measured by.
    if stalled > stalls.HOST.probe_share * len(rtts_us):
        return Row(link, "ping_rtt", Validity.UNKNOWN.past, f"host {stalls.TOO_BUSY}: {told}")
    return Row(link, "ping_rtt", Validity.of(abs(kept.mean - want) <= tol).past, told)


@dataclass(frozen=True)
class IperfResult:
    """What one ``iperf3`` run delivered, at the receiver."""

    goodput_bps: float  # payload bits per second that arrived
    wire_bps: float  # the frame rate on the wire that carried them (what a link's rate limits)
    error: str | None = None  # what iperf3 reported instead, if it failed


def parse_iperf3(text: str) -> IperfResult:
    """The receiver's rate from ``iperf3 -J`` output.

    ``end.sum_received.bits_per_second`` is the payload that arrived over the test's interval, for
    TCP and UDP alike (datagrams dropped at the rate limit do not count). On the wire each segment
    also carried its headers: TCP ``FRAME_OVERHEAD_BYTES`` per ``start.tcp_mss_default`` bytes,
    UDP Ethernet + IPv4 + UDP (42 bytes) per ``start.test_start.blksize`` bytes.
    """
    try:
        doc = json.loads(text)
    except json.JSONDecodeError:
        return IperfResult(0.0, 0.0, f"not JSON: {text[-300:]!r}")
    if not isinstance(doc, dict):
        return IperfResult(0.0, 0.0, f"not an iperf3 report: {text[-300:]!r}")
    if doc.get("error"):
        return IperfResult(0.0, 0.0, str(doc["error"]))
    received = doc.get("end", {}).get("sum_received")
    if not isinstance(received, dict) or "bits_per_second" not in received:
        return IperfResult(0.0, 0.0, "no end.sum_received in the report")
    goodput = float(received["bits_per_second"])
    start = doc.get("start", {})
    if start.get("test_start", {}).get("protocol") == "UDP":
        size = int(start["test_start"].get("blksize") or 0)
        overhead = UDP_FRAME_OVERHEAD_BYTES
    else:
        size, overhead = int(start.get("tcp_mss_default") or DEFAULT_MSS), FRAME_OVERHEAD_BYTES
    if size <= 0:
        return IperfResult(goodput, 0.0, "no segment size in the report")
    return IperfResult(goodput, goodput * (size + overhead) / size)


def judge_rate(link: tuple[int, int], metric: str, got: IperfResult, rate_bps: float) -> Row:
    """The wire rate iperf3's transfer took against the link's rate, within :data:`RATE_REL`."""
    if got.error:
        return Row(link, metric, Validity.FAIL.past, f"iperf3: {got.error}")
    told = (f"{metric} {got.wire_bps / 1e6:.2f} Mbit/s on the wire ({got.goodput_bps / 1e6:.2f} Mbit/s payload), "
            f"link rate {rate_bps / 1e6:g} Mbit/s +- {RATE_REL:.0%}")
    ok = abs(got.wire_bps - rate_bps) <= RATE_REL * rate_bps
    return Row(link, metric, Validity.of(ok).past, told)


# ----------------------------------------------------------------------------- running (root)


def missing_tools() -> list[str]:
    """The tools not on ``PATH``."""
    return [tool for tool in TOOLS if shutil.which(tool) is None]


def require_tools() -> None:
    """Install ``ping``/``iperf3`` with apt if missing (root, apt present); raise naming what is missing."""
    missing = missing_tools()
    if missing and os.geteuid() == 0 and shutil.which("apt-get"):
        packages = sorted({TOOLS[t] for t in missing})
        env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
        cmd = ["apt-get", "install", "-y", "-qq", *packages]
        if subprocess.run(cmd, env=env, capture_output=True, check=False).returncode != 0:
            subprocess.run(["apt-get", "update", "-qq"], env=env, capture_output=True, check=False)
            subprocess.run(cmd, env=env, capture_output=True, check=False)
        missing = missing_tools()
    if missing:
        raise RuntimeError(f"missing {missing}: install {sorted({TOOLS[t] for t in missing})}")


def in_netns(netns: str, argv: list[str]) -> list[str]:
    """``argv`` run in the network namespace at ``netns`` (files and binaries stay the caller's)."""
    return ["nsenter", f"--net={netns}", "--", *argv]


def ping(netns: str, address: str, *, count: int, interval_s: float) -> tuple[list[float], str]:
    """``ping`` from ``netns`` to ``address``: the RTTs in microseconds and the raw output."""
    argv = in_netns(netns, ["ping", "-n", "-c", str(count), "-i", f"{interval_s:g}", "-W", "2", address])
    proc = subprocess.run(argv, capture_output=True, text=True, timeout=count * interval_s + 30, check=False)
    return parse_ping(proc.stdout), proc.stdout + proc.stderr


@contextlib.contextmanager
def iperf3_server(netns: str, port: int = IPERF_PORT) -> Iterator[None]:
    """An ``iperf3`` server in ``netns`` for the duration of the block (killed and reaped after)."""
    proc = subprocess.Popen(in_netns(netns, ["iperf3", "-s", "-p", str(port)]), stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        time.sleep(0.3)  # let it listen (a refused connection is retried below anyway)
        yield
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def iperf3(netns: str, address: str, *, seconds: float, udp_bps: float | None = None,
           port: int = IPERF_PORT) -> IperfResult:
    """One ``iperf3`` client run from ``netns``: what the receiver got.

    ``udp_bps``: UDP offered at that rate (1400-byte datagrams), else TCP.
    """
    argv = ["iperf3", "-c", address, "-p", str(port), "-t", f"{seconds:g}", "-J"]
    if udp_bps is not None:
        argv += ["-u", "-b", f"{int(udp_bps)}", "-l", "1400"]
    out = IperfResult(0.0, 0.0, "not run")
    for _ in range(3):  # the server may not listen yet
        proc = subprocess.run(in_netns(netns, argv), capture_output=True, text=True, timeout=seconds + 30,
                              check=False)
        out = parse_iperf3(proc.stdout or proc.stderr)
        if out.error is None or "refused" not in out.error:
            return out
        time.sleep(0.5)
    return out


def describe(rows: list[Row]) -> list[dict[str, Any]]:
    """Rows as plain dicts (for logs and reports)."""
    return [{"link": list(r.link), "metric": r.metric, "verdict": r.verdict, "why": r.why} for r in rows]
