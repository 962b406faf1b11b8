"""Diagnostic jobs: they check the cluster itself, not a training protocol.

* ``noop``: returns at once (measures dispatch overhead).
* ``sleep``: sleeps ``seconds`` (a stand-in for a long job in churn tests).
* ``fail``: raises (checks that failures reach the host with their reason).
* ``echo_mesh``: every participant exchanges TCP messages with every other participant, ``rounds``
  times, and records the round-trip time of each exchange. It proves that the data plane reaches
  every ordered pair, and with ``rounds`` > 1 it keeps probing over time (churn tests).
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from typing import Any

from squall.job import JobContext
from squall.worker.jsonline import LineError, read_line, write_line

logger = logging.getLogger(__name__)

DEFAULT_PORT = 29400
MAX_LINE = 4096  # bytes in one echo line


def noop(ctx: JobContext) -> dict[str, Any]:
    """Do nothing; report who ran and the config it received."""
    return {"rank": ctx.rank, "pid": os.getpid(), "config": ctx.config}


def sleep(ctx: JobContext) -> dict[str, Any]:
    """Sleep ``config.seconds`` (default 1)."""
    seconds = float(ctx.config.get("seconds", 1.0))
    time.sleep(seconds)
    return {"slept_s": seconds}


def fail(ctx: JobContext) -> None:
    """Raise, with ``config.message`` as the reason."""
    raise RuntimeError(str(ctx.config.get("message", "failing on purpose")))


class _EchoServer:
    """Answers each line ``{"from": r, "n": k}`` with ``{"echo": k, "by": rank}``; counts answers."""

    def __init__(self, rank: int, port: int, expected: int) -> None:
        self.rank = rank
        self.expected = expected
        self.served = 0
        self.lock = threading.Lock()
        self.done = threading.Event()
        self.sock = socket.create_server(("0.0.0.0", port), reuse_port=False, backlog=256)
        self.sock.settimeout(0.2)
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def _serve(self) -> None:
        while not self.done.is_set():
            try:
                conn, _ = self.sock.accept()
            except TimeoutError:
                continue
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10.0)
            try:
                msg = read_line(conn, limit=MAX_LINE)
                write_line(conn, {"echo": msg["n"], "by": self.rank})
            except (OSError, LineError, KeyError) as exc:
                logger.warning("echo server: bad exchange: %s", exc)
                return
        with self.lock:
            self.served += 1
            if self.served >= self.expected:
                self.done.set()

    def close(self) -> None:
        self.done.set()
        self.sock.close()


def _exchange(address: str, port: int, rank: int, n: int, timeout: float) -> tuple[int, float]:
    t0 = time.monotonic()
    with socket.create_connection((address, port), timeout=timeout) as sock:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        write_line(sock, {"from": rank, "n": n})
        answer = read_line(sock, limit=MAX_LINE)
    if answer.get("echo") != n:
        raise ConnectionError(f"wrong echo {answer!r} for {n}")
    return int(answer["by"]), time.monotonic() - t0


def echo_mesh(ctx: JobContext) -> dict[str, Any]:
    """Exchange a TCP message with every other participant, ``rounds`` times.

    Config: ``participants`` (ranks, default all), ``rounds`` (default 1), ``interval_s`` between
    rounds (default 0), ``port`` (default 29400), ``connect_timeout_s`` (how long to retry a peer
    that is not listening yet, default 20).
    """
    cfg = ctx.config
    participants = [int(r) for r in cfg.get("participants", range(ctx.world_size))]
    if ctx.rank not in participants:
        raise ValueError(f"rank {ctx.rank} is not among participants {participants}")
    rounds = int(cfg.get("rounds", 1))
    interval = float(cfg.get("interval_s", 0.0))
    port = int(cfg.get("port", DEFAULT_PORT))
    connect_timeout = float(cfg.get("connect_timeout_s", 20.0))
    targets = [r for r in participants if r != ctx.rank]
    server = _EchoServer(ctx.rank, port, expected=rounds * len(targets))
    server.thread.start()
    ok: dict[int, int] = dict.fromkeys(targets, 0)
    failed: dict[int, int] = dict.fromkeys(targets, 0)
    try:
        for k in range(rounds):
            round_start = time.monotonic()
            for peer in targets:
                deadline = time.monotonic() + connect_timeout
                while True:
                    try:
                        by, rtt = _exchange(ctx.spec.peers[peer], port, ctx.rank, k, timeout=5.0)
                        if by != peer:
                            raise ConnectionError(f"answer came from rank {by}, expected {peer}")
                        ok[peer] += 1
                        ctx.metrics.write(round=k, peer=peer, rtt_s=rtt, ok=True)
                        break
                    except (OSError, ConnectionError, ValueError) as exc:
                        if time.monotonic() >= deadline:
                            failed[peer] += 1
                            ctx.metrics.write(round=k, peer=peer, ok=False, error=str(exc))
                            break
                        time.sleep(0.05)
            time.sleep(max(0.0, interval - (time.monotonic() - round_start)))
        # Stay reachable until every peer has exchanged with us, within the budget.
        server.done.wait(timeout=connect_timeout)
    finally:
        served = server.served
        server.close()
    with contextlib.suppress(Exception):
        logger.info("echo_mesh rank %d: ok=%s failed=%s served=%d", ctx.rank, ok, failed, served)
    return {"ok": {str(k): v for k, v in ok.items()}, "failed": {str(k): v for k, v in failed.items()},
            "served": served}


def _read(path: str) -> str | None:
    try:
        with open(path) as f:
            return f.read().strip()
    except OSError:
        return None


def sysinfo(ctx: JobContext) -> dict[str, Any]:
    """What the container looks like from inside: limits, capabilities, sysctls, identity."""
    caps = None
    status = _read("/proc/self/status") or ""
    for line in status.splitlines():
        if line.startswith("CapEff:"):
            caps = int(line.split()[1], 16)
    rss_kb = None
    agent_status = _read(f"/proc/{os.getppid()}/status") or ""
    for line in agent_status.splitlines():
        if line.startswith("VmRSS:"):
            rss_kb = int(line.split()[1])
    return {
        "rank": ctx.rank, "uid": os.getuid(), "hostname": socket.gethostname(),
        "cap_eff": caps,
        "tcp_rmem": _read("/proc/sys/net/ipv4/tcp_rmem"), "tcp_wmem": _read("/proc/sys/net/ipv4/tcp_wmem"),
        "memory_max": _read("/sys/fs/cgroup/memory.max"), "cpu_max": _read("/sys/fs/cgroup/cpu.max"),
        "memory_current": _read("/sys/fs/cgroup/memory.current"), "agent_rss_kb": rss_kb,
        "src_writable": os.access("/squall/src", os.W_OK),
    }
