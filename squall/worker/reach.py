"""The ``reach`` job: who can open a connection to whom, and at which address each is seen.

Every node serves TCP and UDP on ``port``; at ``start_wall`` each node tries, one target at a time,
to open a TCP connection to every target and to get a UDP datagram answered, with ``timeout_s`` for
each try. A target is a peer's address or any extra address in ``addresses`` (a NAT's, say). The
server answers with the address it saw the client at, so the result tells a NAT's translation from
a direct path. The node keeps serving until ``linger_s`` after its own tries, so slower peers still
find it. It measures reachability, not links: one connection and one datagram per target.
"""

from __future__ import annotations

import json
import socket
import threading
import time
from collections.abc import Iterator
from contextlib import closing, contextmanager
from typing import Any

from squall.job import JobContext

DEFAULT_PORT = 29530
_MAX_MESSAGE = 256


def _answer(seen: tuple[str, int], rank: int) -> bytes:
    return json.dumps({"rank": rank, "seen": seen[0]}).encode()


def _parse(raw: bytes) -> dict[str, Any]:
    value = json.loads(raw.decode() or "{}")
    if not isinstance(value, dict) or not isinstance(value.get("seen"), str) or not isinstance(value.get("rank"), int):
        raise ValueError(f"not an answer of the reach job: {raw[:80]!r}")
    return value


@contextmanager
def _serving(address: str, port: int, rank: int) -> Iterator[None]:
    """Answer every TCP connection and UDP datagram with the address the client was seen at."""
    stop = threading.Event()
    tcp = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    tcp.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    tcp.bind((address, port))
    tcp.listen(64)
    tcp.settimeout(0.2)
    udp = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    udp.bind((address, port))
    udp.settimeout(0.2)

    def serve_tcp() -> None:
        while not stop.is_set():
            try:
                conn, peer = tcp.accept()
            except TimeoutError:
                continue
            with closing(conn):
                conn.sendall(_answer(peer, rank))

    def serve_udp() -> None:
        while not stop.is_set():
            try:
                _, peer = udp.recvfrom(_MAX_MESSAGE)
            except TimeoutError:
                continue
            udp.sendto(_answer(peer, rank), peer)

    threads = [threading.Thread(target=f, daemon=True, name=f"reach-{f.__name__}") for f in (serve_tcp, serve_udp)]
    for t in threads:
        t.start()
    try:
        yield
    finally:
        stop.set()
        for t in threads:
            t.join(timeout=2.0)
        tcp.close()
        udp.close()


def _try_tcp(own: str, target: str, port: int, timeout: float) -> dict[str, Any]:
    t0 = time.monotonic()
    try:
        with socket.create_connection((target, port), timeout=timeout, source_address=(own, 0)) as conn:
            connected = time.monotonic() - t0
            conn.settimeout(timeout)
            answer = _parse(conn.recv(_MAX_MESSAGE))
            return {"ok": True, "seen": answer["seen"], "by": answer["rank"], "connect_s": round(connected, 6)}
    except (OSError, ValueError) as exc:
        return {"ok": False, "error": type(exc).__name__, "after_s": round(time.monotonic() - t0, 3)}


def _try_udp(own: str, target: str, port: int, timeout: float) -> dict[str, Any]:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        sock.bind((own, 0))
        sock.settimeout(timeout)
        t0 = time.monotonic()
        try:
            sock.sendto(b"reach", (target, port))
            raw, _ = sock.recvfrom(_MAX_MESSAGE)
            answer = _parse(raw)
            return {"ok": True, "seen": answer["seen"], "by": answer["rank"], "rtt_s": round(time.monotonic() - t0, 6)}
        except (OSError, ValueError) as exc:
            return {"ok": False, "error": type(exc).__name__}


def reach(ctx: JobContext) -> dict[str, Any]:
    """Config: ``port`` (default 29530), ``addresses`` (extra targets), ``timeout_s`` (per try, default 1.5),
    ``start_wall`` (when to start trying; default one second from now), ``linger_s`` (serving after the
    node's own tries, default the time every other node may need). Result: ``targets``, one entry per
    target address with ``tcp`` and ``udp`` outcomes."""
    cfg = ctx.config
    port = int(cfg.get("port", DEFAULT_PORT))
    timeout = float(cfg.get("timeout_s", 1.5))
    own = ctx.spec.peers[ctx.rank]
    targets = [a for a in ctx.spec.peers if a != own] + [str(a) for a in cfg.get("addresses", [])]
    linger = float(cfg.get("linger_s", 2 * timeout * len(targets) + 1.0))
    start = float(cfg.get("start_wall", time.time() + 1.0))
    results: dict[str, Any] = {}
    with _serving(own, port, ctx.rank):
        time.sleep(max(0.0, start - time.time()))
        for target in targets:
            results[target] = {"tcp": _try_tcp(own, target, port, timeout), "udp": _try_udp(own, target, port, timeout)}
            ctx.metrics.write(target=target, **{k: v["ok"] for k, v in results[target].items()})
        time.sleep(linger)
    return {"address": own, "targets": results}
