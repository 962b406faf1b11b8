"""Parsing and judging of the ping / iperf3 conformance checks (tests/kernel_clients.py), no tools run."""

from __future__ import annotations

import json

import pytest

from squall.calibration.stalls import HOST
from tests import kernel_clients as kc

PING = """PING 172.30.0.3 (172.30.0.3) 56(84) bytes of data.
64 bytes from 172.30.0.3: icmp_seq=1 ttl=64 time=40.2 ms
64 bytes from 172.30.0.3: icmp_seq=2 ttl=64 time=40.1 ms
64 bytes from 172.30.0.3: icmp_seq=2 ttl=64 time=40.3 ms (DUP!)
64 bytes from 172.30.0.3: icmp_seq=3 ttl=64 time=39.95 ms

--- 172.30.0.3 ping statistics ---
3 packets transmitted, 3 received, +1 duplicates, 0% packet loss, time 2003ms
rtt min/avg/max/mdev = 39.950/40.150/40.300/0.100 ms
"""


def test_parse_ping_takes_one_rtt_per_reply() -> None:
    assert kc.parse_ping(PING) == pytest.approx([40200.0, 40100.0, 39950.0])
    assert kc.parse_ping("connect: Network is unreachable\n") == []


@pytest.mark.parametrize("rtt_ms, expected_ms, verdict", [
    (40.1, 40.0, "passed"),   # 0.1 ms unshaped RTT on top: exact
    (42.0, 40.0, "passed"),   # 1.9 ms off: inside 5 % of 40 ms
    (42.4, 40.0, "failed"),   # 2.3 ms off
    (20.1, 40.0, "failed"),   # one direction's delay only: the old nfqueue placement
    (10.5, 10.0, "passed"),   # 0.4 ms off: inside the 0.5 ms floor
    (10.8, 10.0, "failed"),
])
def test_judge_ping_tolerance_is_the_larger_of_half_a_ms_and_5_percent(rtt_ms: float, expected_ms: float,
                                                                         verdict: str) -> None:
    rtts = [rtt_ms * 1e3 + d for d in (-50.0, 0.0, 50.0)] * 20
    row = kc.judge_ping((0, 1), rtts, expected_ms * 1e3, 100.0, sent=60, policy=HOST)
    assert row.verdict == verdict, row.why
    assert row.metric == "ping_rtt" and row.link == (0, 1)


def test_judge_ping_leaves_out_stalls_and_says_unknown_when_they_are_too_many() -> None:
    quiet = [40_100.0] * 90 + [55_000.0] * 10  # a few stalled replies do not move the verdict
    assert kc.judge_ping((0, 1), quiet, 40_000.0, 100.0, sent=100, policy=HOST).verdict == "passed"
    busy = [40_100.0] * 60 + [48_000.0 + 100 * i for i in range(40)]
    row = kc.judge_ping((0, 1), busy, 40_000.0, 100.0, sent=100, policy=HOST)
    assert row.verdict == "unknown" and "too busy" in row.why


def test_judge_ping_fails_when_most_pings_went_unanswered() -> None:
    row = kc.judge_ping((2, 3), [60_000.0] * 10, 60_000.0, 0.0, sent=150, policy=HOST)
    assert row.verdict == "failed" and "10 of 150" in row.why


def _report(bps: float, *, udp: bool = False) -> str:
    start = ({"test_start": {"protocol": "UDP", "blksize": 1400}} if udp
             else {"tcp_mss_default": 1448, "test_start": {"protocol": "TCP", "blksize": 131072}})
    return json.dumps({"start": start, "end": {
        "sum_sent": {"bits_per_second": bps * 1.01}, "sum_received": {"bits_per_second": bps}}})


def test_parse_iperf3_counts_the_headers_on_the_wire() -> None:
    tcp = kc.parse_iperf3(_report(19.1e6))
    assert tcp.error is None and tcp.goodput_bps == 19.1e6
    assert tcp.wire_bps == pytest.approx(19.1e6 * (1448 + 66) / 1448)
    udp = kc.parse_iperf3(_report(19.0e6, udp=True))
    assert udp.wire_bps == pytest.approx(19.0e6 * 1442 / 1400)


@pytest.mark.parametrize("text, error", [
    (json.dumps({"error": "unable to connect to server: Connection refused"}),
     "unable to connect to server: Connection refused"),
    (json.dumps({"end": {}}), "no end.sum_received in the report"),
    (json.dumps({"start": {"test_start": {"protocol": "UDP"}}, "end": {"sum_received": {"bits_per_second": 1.0}}}),
     "no segment size in the report"),
])
def test_parse_iperf3_reports_what_went_wrong(text: str, error: str) -> None:
    assert kc.parse_iperf3(text).error == error
    for junk in ("iperf3: error", "[]"):
        assert kc.parse_iperf3(junk).error is not None


@pytest.mark.parametrize("wire, verdict", [(19.7e6, "passed"), (18.7e6, "passed"), (18.5e6, "failed"),
                                           (21.3e6, "passed"), (21.5e6, "failed")])
def test_judge_rate_within_7_percent_on_the_wire(wire: float, verdict: str) -> None:
    got = kc.IperfResult(wire * 0.956, wire)
    assert kc.judge_rate((1, 2), "iperf3_tcp", got, 20e6).verdict == verdict


def test_judge_rate_fails_on_an_iperf3_error() -> None:
    row = kc.judge_rate((1, 2), "iperf3_udp", kc.IperfResult(20e6, 20e6, "server busy"), 20e6)
    assert row.verdict == "failed" and "server busy" in row.why


def test_in_netns_wraps_the_command() -> None:
    assert kc.in_netns("/proc/7/ns/net", ["ping", "-c", "1", "x"]) == [
        "nsenter", "--net=/proc/7/ns/net", "--", "ping", "-c", "1", "x"]
