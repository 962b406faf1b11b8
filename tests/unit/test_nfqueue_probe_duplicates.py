"""The UDP echo probe keeps collecting until every request is answered, not until it holds as many replies.

A link that duplicates answers some requests twice. A probe that stopped once it held ``count``
replies would stop while the last requests were still in flight and report them lost, and the
duplicates it was meant to count with them. Here a loopback echo answers every request twice,
both copies held back until the probe has sent everything, so the stop rule alone decides.
"""

from __future__ import annotations

import socket
import struct
import threading
import time

from squall.shaping.testnet.echo_probe import probe

_STAMP = struct.Struct("!Q")


def _doubling_echo(sock: socket.socket, expected: int, hold_s: float, stop: threading.Event) -> None:
    """Collect ``expected`` requests, wait ``hold_s``, then answer each twice (receive time appended)."""
    held: list[tuple[bytes, tuple[str, int]]] = []
    sock.settimeout(0.2)
    while len(held) < expected and not stop.is_set():
        try:
            data, peer = sock.recvfrom(2048)
        except TimeoutError:
            continue
        held.append((data + _STAMP.pack(time.monotonic_ns()), peer))
    time.sleep(hold_s)
    for reply, peer in held:
        for _ in range(2):
            sock.sendto(reply, peer)
            time.sleep(0.0005)  # keep the loopback receive buffer from overflowing


def test_duplicated_replies_do_not_end_the_probe_early() -> None:
    count = 40
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as server, \
            socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as client:
        server.bind(("127.0.0.1", 0))
        client.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 1 << 20)
        stop = threading.Event()
        echo = threading.Thread(target=_doubling_echo, args=(server, count, 0.2, stop), daemon=True)
        echo.start()
        try:
            # wait_s is generous: the replies come 0.2 s after the last request, 80 of them 0.5 ms apart.
            result = probe(client, server.getsockname(), count=count, interval_us=1000, wait_s=10.0)
        finally:
            stop.set()
            echo.join(timeout=30)
    assert result.sent == count
    assert result.received == count, f"{result.lost} requests reported lost: the probe stopped early"
    assert len(result.seqs) == 2 * count  # every duplicate counted
    assert sorted(set(result.seqs)) == list(range(count))
