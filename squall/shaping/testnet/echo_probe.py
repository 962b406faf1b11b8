"""Application-level UDP echo probe, for measuring what packets really experience.

ICMP ping reads its receive timestamp before PREROUTING and so under-reports delay added there;
this probe measures at the application. The echo server answers each datagram with the datagram
plus its own receive time. All namespaces of one host share ``CLOCK_MONOTONIC``, so besides the
round-trip time the client gets the forward one-way delay (server receive - client send).

Server, inside the receiving namespace::

    ip netns exec NS python -m squall.shaping.testnet.echo_probe echo --port 9000

It prints ``ready`` once bound and serves until killed. The client is a library call on a UDP
socket that may have been created in another namespace (:func:`squall.shaping.kernel.netns.socket_in`).
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import socket
import struct
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass

logger = logging.getLogger(__name__)

_REQUEST = struct.Struct("!IQ")  # sequence number, client send time (ns)
_STAMP = struct.Struct("!Q")  # server receive time (ns), appended to the echo
#: Once every request is answered, the probe waits this long past the round-trip spread for more.
LINGER_NS = 10_000_000


@dataclass(frozen=True)
class ProbeResult:
    """What one probe run measured; lists are in order of arrival of the replies."""

    sent: int  # requests sent
    seqs: tuple[int, ...]  # sequence numbers of the replies received
    send_ns: tuple[int, ...]  # client send time of each answered request
    rtt_us: tuple[float, ...]  # round-trip time of each reply
    one_way_us: tuple[float, ...]  # forward delay client -> server of each reply

    @property
    def received(self) -> int:
        """Distinct requests answered."""
        return len(set(self.seqs))

    @property
    def lost(self) -> int:
        """Requests never answered (lost on either way or later than the wait)."""
        return self.sent - self.received


@contextlib.contextmanager
def realtime(priority: int) -> Iterator[bool]:
    """Run the calling thread as SCHED_FIFO ``priority`` inside the block (True when it could), then as before.

    A probe that timestamps in userspace measures its own wake-up too: on a busy host a normal
    process wakes milliseconds late now and then, which reads as delay the link never added. The
    echo servers run below the delay daemon (10) and above any worker; so does a probing thread.
    """
    before = os.sched_getscheduler(0), os.sched_getparam(0)
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except (PermissionError, OSError) as exc:
        logger.info("probing without SCHED_FIFO %d (%s): wake-ups may read as delay", priority, exc)
        yield False
        return
    try:
        yield True
    finally:
        os.sched_setscheduler(0, before[0], before[1])


def probe(
    sock: socket.socket,
    target: tuple[str, int],
    *,
    count: int,
    interval_us: int,
    size: int = 64,
    wait_s: float = 1.0,
) -> ProbeResult:
    """Send ``count`` requests ``interval_us`` apart; collect echoes until ``wait_s`` after the last.

    It stops early once every request has been answered at least once and nothing more has
    arrived for the spread of the round-trip times seen so far plus :data:`LINGER_NS` (a late
    duplicate of the last replies lags its original by at most about that spread, its own
    delay draw). Counting replies instead would stop as soon as duplicates made up for the
    requests still in flight, and drop the last replies of a link that duplicates (and with them
    the duplicates it was asked to count).
    """
    if count < 1:
        raise ValueError(f"probe: count must be >= 1, got {count}")
    pad = b"\0" * max(0, size - _REQUEST.size)
    sock.setblocking(False)
    seqs: list[int] = []
    answered: set[int] = set()
    sends: list[int] = []
    rtts: list[float] = []
    one_way: list[float] = []
    start = time.monotonic_ns()
    sent = 0
    deadline = None
    last_arrival = start
    buf = bytearray(65536)
    while True:
        now = time.monotonic_ns()
        if sent < count and now >= start + sent * interval_us * 1000:
            sock.sendto(_REQUEST.pack(sent, now) + pad, target)
            sent += 1
            if sent == count:
                deadline = now + int(wait_s * 1e9)
            continue
        quiet_until = None
        if deadline is not None and len(answered) >= count:
            quiet_until = last_arrival + int((max(rtts) - min(rtts)) * 1000) + LINGER_NS
        if deadline is not None and (now >= deadline or (quiet_until is not None and now >= quiet_until)):
            break
        wake = start + sent * interval_us * 1000 if sent < count else min(deadline or now, quiet_until or now + 10**12)
        select.select([sock], [], [], max(0.0, (wake - now) / 1e9))
        while True:
            try:
                n = sock.recv_into(buf)
            except BlockingIOError:
                break
            got = time.monotonic_ns()
            last_arrival = got
            if n < _REQUEST.size + _STAMP.size:
                continue
            seq, t_send = _REQUEST.unpack_from(buf, 0)
            (t_server,) = _STAMP.unpack_from(buf, n - _STAMP.size)
            seqs.append(seq)
            answered.add(seq)
            sends.append(t_send)
            rtts.append((got - t_send) / 1000)
            one_way.append((t_server - t_send) / 1000)
    return ProbeResult(sent, tuple(seqs), tuple(sends), tuple(rtts), tuple(one_way))


def serve_echo(port: int, host: str = "0.0.0.0", realtime: int = 0) -> None:
    """Echo every datagram with the receive time appended; never returns.

    The receive time is taken in userspace on purpose: the kernel's socket timestamp is set
    before PREROUTING and would not include the delay added there. ``realtime`` (SCHED_FIFO
    priority, below the daemon's) keeps a busy machine from adding scheduling delay to it.
    """
    if realtime:
        try:
            os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(realtime))
        except PermissionError:
            sys.stderr.write("probe echo: no CAP_SYS_NICE, running with normal priority\n")
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind((host, port))
    sys.stdout.write("ready\n")
    sys.stdout.flush()
    buf = bytearray(65536)
    view = memoryview(buf)
    while True:
        n, addr = sock.recvfrom_into(buf)
        stamp = _STAMP.pack(time.monotonic_ns())
        sock.sendto(bytes(view[:n]) + stamp, addr)


def main(argv: list[str] | None = None) -> int:
    """``echo --port P``: run the echo server."""
    parser = argparse.ArgumentParser(prog="python -m squall.shaping.testnet.echo_probe")
    sub = parser.add_subparsers(dest="mode", required=True)
    echo = sub.add_parser("echo", help="UDP echo server that stamps its receive time")
    echo.add_argument("--port", type=int, required=True)
    echo.add_argument("--host", default="0.0.0.0")
    echo.add_argument("--realtime", type=int, default=0, help="SCHED_FIFO priority, 0 = normal")
    args = parser.parse_args(argv)
    if args.mode == "echo":
        serve_echo(args.port, args.host, args.realtime)
    return 0


if __name__ == "__main__":
    sys.exit(main())
