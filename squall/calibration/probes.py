"""Measurement jobs: what packets really experience between containers, measured by the applications.

Kernel receive timestamps are taken before ``PREROUTING``, where the nfqueue backend holds packets,
so every time here is read in user space, right after ``recv`` returns. Probes are scheduled on the
wall clock (``start_wall``): every container on one host shares ``CLOCK_REALTIME``, and on several
hosts NTP keeps it within a millisecond, far below the lead time the host gives.

* ``udp_probe``: every node serves a UDP echo; for each directed pair ``(src, dst)`` in ``pairs`` the
  source sends ``count`` datagrams at ``rate_pps`` with a sequence number and its send time. The
  echo adds the server's receive time. Per target the source reports round-trip times, the forward
  and return legs (meaningful only when the nodes share ``CLOCK_MONOTONIC``, which they report as
  ``clock``), and which sequence numbers never came back; per source the server reports what it
  received, so loss can be told apart by direction.
* ``tcp_goodput``: timed bulk transfers from ``transfers`` (each ``{src, dst, at_s, seconds,
  warmup_s}``), measured at the receiver over ``[first byte + warmup_s, first byte + seconds]``.
  The host chooses the schedule; by default it runs one transfer at a time, so that transfers do
  not compete for the host's cores. Transfers that start together run together (a sender runs each
  of its transfers on a thread of its own): a node sending to all its peers at once.
* ``tcp_rtt``: request/response round trips over one TCP connection per pair, the fallback when
  UDP cannot be used (it sees retransmissions, not loss).

Through a NAT. A link into a node behind a NAT carries only what answers a connection that node
opened, as on the internet. For such a pair the node opens it: in ``udp_probe`` (``punch``) the
target sends hellos from its echo server to the prober's client socket (a fixed port then), and
the prober probes the address the hellos came from (the NAT's); in ``tcp_goodput`` a transfer
with ``dial_back`` is a connection the receiver opens and the sender streams into.

All times in the summaries are microseconds; summaries are ``{count, mean, sd, min, p50, p90,
p99, max}`` (``sd`` is the sample standard deviation, ``n - 1`` in the denominator).
"""

from __future__ import annotations

import contextlib
import math
import os
import select
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from typing import Any

from squall.job import JobContext

UDP_PORT = 29510
TCP_PORT = 29511
RTT_PORT = 29512
START_LEAD_S = 1.0  # default lead before start_wall when the host gives none
MAX_LOST_LISTED = 64  # lost sequence numbers listed per target (the count is always exact)
_CHUNK = 1 << 16  # bytes per send of the bulk transfer
_RECV = 1 << 20  # receive buffer of the bulk transfer

_UDP = struct.Struct("!BxHIqq")  # kind, source rank, sequence, client send ns, server receive ns
_PROBE, _ECHO, _HELLO = 1, 2, 3
HELLO_LEAD_S = 0.3  # a target behind a NAT starts its hellos this long before the first probe
HELLO_EVERY_S = 0.05  # ... and repeats them until the prober's first probe arrives
_TCP_HELLO = struct.Struct("!HHI")  # source rank, transfer index, magic
_MAGIC = 0x5351_4C4C
_MAGIC_PULL = 0x5351_5055  # a receiver behind a NAT opened the connection: the sender streams into it


# -- shared helpers ------------------------------------------------------------------------------
def summary(values: Sequence[float]) -> dict[str, float]:
    """``{count, mean, sd, min, p50, p90, p99, max}`` of ``values`` (empty input: count 0 only)."""
    n = len(values)
    if n == 0:
        return {"count": 0}
    ordered = sorted(values)
    mean = math.fsum(ordered) / n
    var = math.fsum((v - mean) ** 2 for v in ordered) / (n - 1) if n > 1 else 0.0

    def pct(q: float) -> float:
        return ordered[min(n - 1, int(q * n))]

    return {
        "count": n,
        "mean": mean,
        "sd": math.sqrt(var),
        "min": ordered[0],
        "p50": pct(0.5),
        "p90": pct(0.9),
        "p99": pct(0.99),
        "max": ordered[-1],
    }


def clock_identity() -> dict[str, str | None]:
    """Which monotonic clock this process reads: kernel boot id and time namespace."""

    def read(path: str, link: bool = False) -> str | None:
        try:
            if link:
                return os.readlink(path)
            with open(path) as f:
                return f.read().strip()
        except OSError:
            return None

    return {"boot_id": read("/proc/sys/kernel/random/boot_id"), "time_ns": read("/proc/self/ns/time", link=True)}


def _pairs(raw: Any, world_size: int) -> tuple[tuple[int, int], ...]:
    """Directed pairs from config (default every ordered pair), checked against the cluster."""
    if raw is None:
        return tuple((s, d) for s in range(world_size) for d in range(world_size) if s != d)
    pairs = tuple((int(p[0]), int(p[1])) for p in raw)
    for s, d in pairs:
        if s == d or not (0 <= s < world_size and 0 <= d < world_size):
            raise ValueError(f"pair {s} -> {d} is not a link of a {world_size}-node cluster")
    return pairs


def _monotonic_at(wall: float) -> float:
    """The monotonic time at which the wall clock will read ``wall``."""
    return time.monotonic() + (wall - time.time())


def _sleep_until(mono: float) -> None:
    while (left := mono - time.monotonic()) > 0:
        time.sleep(min(left, 0.5))


# -- UDP echo probe ------------------------------------------------------------------------------
@dataclass(frozen=True)
class UdpProbeConfig:
    """Parameters of ``udp_probe`` (all from the job's config)."""

    pairs: tuple[tuple[int, int], ...]  # (prober, target); default every ordered pair
    count: int = 500  # datagrams per pair
    rate_pps: float = 200.0  # datagrams per second per pair
    size: int = 64  # bytes of UDP payload (at least the 24-byte header)
    wait_s: float = 1.0  # after the last send, how long replies are still counted
    port: int = UDP_PORT  # the echo servers' port
    start_wall: float = 0.0  # wall-clock time of the first send (every node uses the same)
    raw: bool = False  # also write every reply to metrics
    punch: tuple[tuple[int, int], ...] = ()  # (prober, target) pairs whose target opens the way (behind a NAT)

    @classmethod
    def from_config(cls, cfg: dict[str, Any], world_size: int) -> UdpProbeConfig:
        """Validate the job config."""
        conf = cls(
            pairs=_pairs(cfg.get("pairs"), world_size),
            count=int(cfg.get("count", 500)),
            rate_pps=float(cfg.get("rate_pps", 200.0)),
            size=int(cfg.get("size", 64)),
            wait_s=float(cfg.get("wait_s", 1.0)),
            port=int(cfg.get("port", UDP_PORT)),
            start_wall=float(cfg.get("start_wall") or time.time() + START_LEAD_S),
            raw=bool(cfg.get("raw", False)),
            punch=_pairs(cfg.get("punch", []), world_size) if cfg.get("punch") else (),
        )
        if not set(conf.punch) <= set(conf.pairs):
            raise ValueError(f"bad udp_probe config: punch {conf.punch} names pairs that are not probed")
        if conf.count < 1 or conf.rate_pps <= 0 or conf.wait_s < 0 or not _UDP.size <= conf.size <= 1400:
            raise ValueError(
                f"bad udp_probe config {cfg!r}: need count >= 1, rate_pps > 0, wait_s >= 0, {_UDP.size} <= size <= 1400"
            )
        return conf

    @property
    def stop_wall(self) -> float:
        """When every node stops: the last scheduled send plus ``wait_s``."""
        return self.start_wall + self.count / self.rate_pps + self.wait_s


@dataclass
class _Target:
    """What one prober learned about one target."""

    rank: int
    address: tuple[str, int]
    offset_ns: int  # stagger of this target's schedule
    sent: int = 0
    unsent: int = 0  # of ``sent``, datagrams the kernel refused (ENOBUFS): they never entered the link
    replies: dict[int, tuple[int, int, int]] = field(default_factory=dict)  # seq -> (send, server, receive) ns
    duplicates: int = 0

    def result(self, count: int) -> dict[str, Any]:
        lost = [s for s in range(self.sent) if s not in self.replies]
        times = list(self.replies.values())
        return {
            "sent": self.sent,
            "unsent": self.unsent,
            "replies": len(self.replies),
            "lost": len(lost),
            "duplicates": self.duplicates,
            "lost_seqs": lost[:MAX_LOST_LISTED],
            "scheduled": count,
            "rtt_us": summary([(r - s) / 1e3 for s, _, r in times]),
            "fwd_us": summary([(v - s) / 1e3 for s, v, _ in times]),
            "rev_us": summary([(r - v) / 1e3 for _, v, r in times]),
        }


class _UdpNode:
    """One node's echo server and prober, driven by a single-threaded select loop."""

    def __init__(self, ctx: JobContext, conf: UdpProbeConfig) -> None:
        self.ctx, self.conf = ctx, conf
        own = ctx.spec.peers[ctx.rank]  # bind the data-plane address: probes leave from it, as traffic does
        self.server = _udp_socket((own, conf.port))
        self.server_up_wall = time.time()
        # a prober whose target opens the way needs a port the target knows
        self.client = _udp_socket((own, conf.port + 1 if any(s == ctx.rank for s, _ in conf.punch) else 0))
        # targets behind a NAT: the probers they send hellos to, until each one's first probe arrives
        self.hellos = {s: (ctx.spec.peers[s], conf.port + 1) for s, d in conf.punch if d == ctx.rank}
        mine = [d for s, d in conf.pairs if s == ctx.rank]
        step = int(1e9 / conf.rate_pps)
        self.step_ns = step
        self.targets = [
            _Target(d, (ctx.spec.peers[d], conf.port), step * k // max(1, len(mine))) for k, d in enumerate(mine)
        ]
        self.by_rank = {t.rank: t for t in self.targets}
        self.received: dict[int, set[int]] = {s: set() for s, d in conf.pairs if d == ctx.rank}
        self.echoed: dict[int, int] = dict.fromkeys(self.received, 0)
        self.unechoed: dict[int, int] = dict.fromkeys(self.received, 0)  # echoes the kernel refused to send
        self.stray = 0
        self.rx_dropped: dict[str, int] = {"server": 0, "client": 0}
        self.pad = b"\0" * (conf.size - _UDP.size)
        self.buf = bytearray(2048)

    def run(self) -> float:
        """Probe until the common stop time; return how late this node was for ``start_wall`` (s)."""
        start_ns = int(_monotonic_at(self.conf.start_wall) * 1e9)
        stop_ns = int(_monotonic_at(self.conf.stop_wall) * 1e9)
        late = (time.monotonic_ns() - start_ns) / 1e9
        while (now := time.monotonic_ns()) < stop_ns:
            due = self._send_due(start_ns, now)
            timeout = (min(due, stop_ns) - time.monotonic_ns()) / 1e9
            ready, _, _ = select.select([self.server, self.client], [], [], max(0.0, timeout))
            if self.server in ready:
                self._serve()
            if self.client in ready:
                self._collect()
        return late

    def _send_due(self, start_ns: int, now: int) -> int:
        """Send every datagram whose time has come; return when the next one is due."""
        nxt = 1 << 62
        if self.hellos:
            nxt = self._hello_due(start_ns, now)
        for t in self.targets:
            while t.sent < self.conf.count and start_ns + t.offset_ns + t.sent * self.step_ns <= now:
                packet = _UDP.pack(_PROBE, self.ctx.rank, t.sent, time.monotonic_ns(), 0) + self.pad
                try:
                    self.client.sendto(packet, t.address)
                except OSError:  # ENOBUFS, unreachable: this host's refusal, not the link's loss
                    t.unsent += 1
                t.sent += 1
            if t.sent < self.conf.count:
                nxt = min(nxt, start_ns + t.offset_ns + t.sent * self.step_ns)
        return nxt

    def _hello_due(self, start_ns: int, now: int) -> int:
        """Behind a NAT: open the way for each prober still waiting (a hello from the echo server)."""
        every = int(HELLO_EVERY_S * 1e9)
        first = start_ns - int(HELLO_LEAD_S * 1e9)
        if now < first:
            return first
        hello = _UDP.pack(_HELLO, self.ctx.rank, 0, 0, 0)
        for src in list(self.hellos):
            if self.received.get(src):
                del self.hellos[src]  # its probes arrive: the way is open
                continue
            with contextlib.suppress(OSError):
                self.server.sendto(hello, self.hellos[src])
        return now + every

    def _serve(self) -> None:
        for n, addr in _drain(self.server, self.buf):
            stamp = time.monotonic_ns()
            if n < _UDP.size:
                self.stray += 1
                continue
            kind, src, seq, sent_ns, _ = _UDP.unpack_from(self.buf)
            if kind != _PROBE or src not in self.received:
                self.stray += 1
                continue
            self.received[src].add(seq)
            self.echoed[src] += 1
            echo = _UDP.pack(_ECHO, self.ctx.rank, seq, sent_ns, stamp) + bytes(self.buf[_UDP.size : n])
            try:
                self.server.sendto(echo, addr)
            except OSError:  # a full send buffer: the echo never entered the return link
                self.unechoed[src] += 1

    def _collect(self) -> None:
        for n, addr in _drain(self.client, self.buf):
            got = time.monotonic_ns()
            if n < _UDP.size:
                continue
            kind, rank, seq, sent_ns, server_ns = _UDP.unpack_from(self.buf)
            target = self.by_rank.get(rank)
            if kind == _HELLO and target is not None and (self.ctx.rank, rank) in self.conf.punch:
                target.address = addr  # where the target's NAT maps this socket's flow: probe it there
                continue
            if kind != _ECHO or target is None:
                continue
            if seq in target.replies:
                target.duplicates += 1
            else:
                target.replies[seq] = (sent_ns, server_ns, got)

    def result(self, late_s: float) -> dict[str, Any]:
        return {
            "rank": self.ctx.rank,
            "clock": clock_identity(),
            "start_wall": self.conf.start_wall,
            "server_up_wall": self.server_up_wall,
            "late_s": late_s,
            "stray": self.stray,
            "rx_dropped": self.rx_dropped,
            "targets": {str(t.rank): t.result(self.conf.count) for t in self.targets},
            "sources": {str(s): {"received": len(seqs), "echoed": self.echoed[s], "unechoed": self.unechoed[s]}
                        for s, seqs in self.received.items()},
        }

    def read_drops(self) -> None:
        """Keep what each socket's full receive buffer dropped (call before :meth:`close`)."""
        drops = socket_drops([self.server, self.client])
        self.rx_dropped = {"server": drops.get(self.server.fileno(), 0), "client": drops.get(self.client.fileno(), 0)}

    def close(self) -> None:
        self.server.close()
        self.client.close()


def _udp_socket(address: tuple[str, int]) -> socket.socket:
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    with contextlib.suppress(OSError):
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
    sock.bind(address)
    sock.setblocking(False)
    return sock


def socket_drops(socks: Sequence[socket.socket], table: str = "/proc/self/net/udp") -> dict[int, int]:
    """Datagrams the kernel dropped on arrival at each socket (its receive buffer was full), by fd.

    The last column of ``/proc/net/udp`` (this network namespace's UDP sockets), matched by the
    socket's inode. Such a drop happened on this host after the link delivered the datagram, so
    the probe must not count it as the link's loss. A socket not found reads 0.
    """
    inodes = {os.fstat(s.fileno()).st_ino: s.fileno() for s in socks}
    out: dict[int, int] = {}
    try:
        with open(table) as f:
            lines = f.read().splitlines()[1:]
    except OSError:
        return out
    for line in lines:
        fields = line.split()
        if len(fields) >= 13 and fields[9].isdigit() and int(fields[9]) in inodes and fields[-1].isdigit():
            out[inodes[int(fields[9])]] = int(fields[-1])
    return out


def _drain(sock: socket.socket, buf: bytearray) -> Iterator[tuple[int, Any]]:
    """Every datagram waiting on ``sock``, one at a time (the caller reads ``buf`` in between)."""
    while True:
        try:
            yield sock.recvfrom_into(buf)
        except OSError:  # EAGAIN: nothing left; an ICMP error: nothing to read either
            return


def udp_probe(ctx: JobContext) -> dict[str, Any]:
    """UDP echo probe of every directed pair in ``pairs``; see the module docstring.

    Config: ``pairs``, ``count``, ``rate_pps``, ``size``, ``wait_s``, ``port``, ``start_wall``,
    ``raw`` (see :class:`UdpProbeConfig`). With ``raw`` every reply goes to metrics as one record
    per target: sequence numbers and the three monotonic stamps, plus the wall-clock offset.
    """
    conf = UdpProbeConfig.from_config(ctx.config, ctx.world_size)
    node = _UdpNode(ctx, conf)
    try:
        late = node.run()
        node.read_drops()
    finally:
        node.close()
    if conf.raw:
        offset = time.time_ns() - time.monotonic_ns()
        for t in node.targets:
            rows = sorted(t.replies.items())
            ctx.metrics.write(
                kind="udp_raw",
                src=ctx.rank,
                dst=t.rank,
                seq=[s for s, _ in rows],
                send_ns=[v[0] for _, v in rows],
                server_ns=[v[1] for _, v in rows],
                recv_ns=[v[2] for _, v in rows],
                wall_offset_ns=offset,
            )
    return node.result(late)


# -- TCP bulk transfer ---------------------------------------------------------------------------
def _accept_loop(server: socket.socket, stop: threading.Event, handle: Callable[[socket.socket], None]) -> None:
    """Hand every accepted connection to ``handle`` on a thread of its own, until ``stop`` is set.

    ``server`` needs a timeout, so that ``stop`` is seen; closing it ends the loop at once.
    """
    while not stop.is_set():
        try:
            conn, _ = server.accept()
        except TimeoutError:
            continue
        except OSError:
            return
        threading.Thread(target=handle, args=(conn,), daemon=True).start()



@dataclass(frozen=True)
class Transfer:
    """One timed bulk transfer of ``tcp_goodput``."""

    index: int  # position in the schedule
    src: int  # sender rank
    dst: int  # receiver rank
    at_s: float  # start, seconds after start_wall
    seconds: float  # measured from the first byte the receiver sees
    warmup_s: float  # bytes before first byte + warmup_s do not count (slow start, token bucket burst)
    sndbuf: int = 0  # SO_SNDBUF of the sender; 0 lets the kernel autotune
    dial_back: bool = False  # the receiver (behind a NAT) opens the connection, the sender streams into it

    @classmethod
    def parse(cls, index: int, raw: dict[str, Any], world_size: int) -> Transfer:
        """One entry of ``transfers``."""
        t = cls(
            index,
            int(raw["src"]),
            int(raw["dst"]),
            float(raw.get("at_s", 0.0)),
            float(raw.get("seconds", 2.0)),
            float(raw.get("warmup_s", 0.5)),
            int(raw.get("sndbuf", 0)),
            bool(raw.get("dial_back", False)),
        )
        _pairs([(t.src, t.dst)], world_size)
        if not 0 <= t.warmup_s < t.seconds or t.at_s < 0 or t.sndbuf < 0:
            raise ValueError(f"transfer {raw!r}: need 0 <= warmup_s < seconds, at_s >= 0, sndbuf >= 0")
        return t


class _Receiver:
    """Accepts the transfers meant for this node and measures each at the receiver; streams the
    transfers whose receiver dials back into the connections it opens."""

    def __init__(self, address: str, port: int, expected: list[Transfer], pulled: list[Transfer],
                 start_mono: float) -> None:
        self.expected = {t.index: t for t in expected}
        self.pulled = {t.index: t for t in pulled}  # this node sends, its receiver connects
        self.start_mono = start_mono
        self.results: dict[int, dict[str, Any]] = {}
        self.sent: dict[int, dict[str, Any]] = {}
        self.errors: list[str] = []
        self.lock = threading.Lock()
        self.sock = socket.create_server((address, port), backlog=64)
        self.sock.settimeout(0.2)
        self.stop = threading.Event()
        self.thread = threading.Thread(target=_accept_loop, args=(self.sock, self.stop, self._measure), daemon=True)

    def _measure(self, conn: socket.socket) -> None:
        with conn:
            conn.settimeout(10.0)
            try:
                src, index, magic = _TCP_HELLO.unpack(_recv_exact(conn, _TCP_HELLO.size))
            except (OSError, ConnectionError) as exc:
                self.errors.append(f"bad hello: {type(exc).__name__}: {exc}")
                return
            pull = self.pulled.get(index)
            if magic == _MAGIC_PULL and pull is not None and pull.dst == src:
                sent = _stream(conn, self.start_mono + pull.at_s + pull.seconds + 5.0, pull.sndbuf)
                with self.lock:
                    self.sent[index] = {"index": index, "dst": pull.dst, **sent}
                return
            t = self.expected.get(index)
            if magic != _MAGIC or t is None or t.src != src:
                self.errors.append(f"unexpected transfer {index} from rank {src}")
                return
            result = _measure_guarded(conn, t)
        with self.lock:
            self.results[index] = {"index": index, "src": src, "dst": t.dst, **result}

    def done(self) -> bool:
        with self.lock:
            return len(self.results) >= len(self.expected) and len(self.sent) >= len(self.pulled)

    def close(self) -> None:
        self.stop.set()
        self.sock.close()


def _measure_guarded(conn: socket.socket, t: Transfer) -> dict[str, Any]:
    """:func:`_measure_stream`, an error as a result; then reset the connection so its sender stops."""
    try:
        result = _measure_stream(conn, t)
    except (OSError, ConnectionError) as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    with contextlib.suppress(OSError):  # closing with unread data resets the sender: it stops
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
    return result


def _recv_exact(conn: socket.socket, n: int) -> bytes:
    data = bytearray()
    while len(data) < n:
        chunk = conn.recv(n - len(data))
        if not chunk:
            raise ConnectionError("peer closed before the header was complete")
        data += chunk
    return bytes(data)


def _measure_stream(conn: socket.socket, t: Transfer) -> dict[str, Any]:
    """Read for ``t.seconds`` from the first byte; count bytes in the window after ``t.warmup_s``."""
    buf = bytearray(_RECV)
    total = conn.recv_into(buf)
    first, first_wall = time.monotonic(), time.time()
    if total == 0:
        raise ConnectionError("sender closed before sending data")
    mark_at, end_at = first + t.warmup_s, first + t.seconds
    marked: tuple[float, int] | None = None
    now = first
    while now < end_at:
        conn.settimeout(max(0.05, end_at - now))
        try:
            got = conn.recv_into(buf)
        except TimeoutError:
            got = -1
        now = time.monotonic()
        if got == 0:
            break
        total += max(got, 0)
        if marked is None and now >= mark_at:
            marked = (now, total)
    if marked is None or now - marked[0] <= 0:
        return {
            "error": f"the stream ended {now - first:.3f} s after its first byte, before the warm-up ended",
            "bytes": total,
        }
    window = now - marked[0]
    return {
        "bytes": total,
        "first_wall": first_wall,
        "window_s": window,
        "goodput_bps": (total - marked[1]) * 8 / window,
        "mss": conn.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG),
        "ended_early": now < end_at,
    }


def _send_transfer(peers: Sequence[str], port: int, rank: int, t: Transfer, start_mono: float) -> dict[str, Any]:
    """Connect at the transfer's time and send until the receiver closes (or a deadline passes)."""
    _sleep_until(start_mono + t.at_s)
    try:
        with _connect_retrying((peers[t.dst], port), until=start_mono + t.at_s + 3.0, source=peers[rank]) as sock:
            sock.sendall(_TCP_HELLO.pack(rank, t.index, _MAGIC))
            sent = _stream(sock, start_mono + t.at_s + t.seconds + 5.0, t.sndbuf)
    except OSError as exc:
        sent = {"sent_bytes": 0, "mss": 0, "error": f"{type(exc).__name__}: {exc}"}
    return {"index": t.index, "dst": t.dst, **sent}


def _stream(sock: socket.socket, deadline: float, sndbuf: int) -> dict[str, Any]:
    """Send until the receiver closes (the normal end) or ``deadline`` (monotonic) passes."""
    sent, mss, error = 0, 0, None
    try:
        if sndbuf:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, sndbuf)
        mss = sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_MAXSEG)
        chunk = b"\x5a" * _CHUNK
        sock.settimeout(2.0)
        while time.monotonic() < deadline:
            sent += sock.send(chunk)
    except (ConnectionResetError, BrokenPipeError):
        pass  # the receiver closed the window: the normal end
    except OSError as exc:
        error = f"{type(exc).__name__}: {exc}"
    return {"sent_bytes": sent, "mss": mss, "error": error}


def _pull_transfer(peers: Sequence[str], port: int, rank: int, t: Transfer, start_mono: float) -> dict[str, Any]:
    """Behind a NAT: open the connection to the sender at the transfer's time and measure what it streams."""
    _sleep_until(start_mono + t.at_s)
    try:
        with _connect_retrying((peers[t.src], port), until=start_mono + t.at_s + 3.0, source=peers[rank]) as sock:
            sock.sendall(_TCP_HELLO.pack(rank, t.index, _MAGIC_PULL))
            result = _measure_guarded(sock, t)
    except OSError as exc:
        result = {"error": f"{type(exc).__name__}: {exc}"}
    return {"index": t.index, "src": t.src, "dst": t.dst, **result}


def _connect_retrying(address: tuple[str, int], *, until: float, source: str) -> socket.socket:
    while True:
        try:
            return socket.create_connection(address, timeout=2.0, source_address=(source, 0))
        except OSError:
            if time.monotonic() >= until:
                raise
            time.sleep(0.05)


def tcp_goodput(ctx: JobContext) -> dict[str, Any]:
    """Timed bulk transfers; see the module docstring.

    Config: ``transfers`` (list of ``{src, dst, at_s, seconds, warmup_s, sndbuf}``), ``start_wall``,
    ``port``. Returns ``received`` (this node's measurements as receiver: goodput in bit/s of TCP
    payload, the window, the MSS) and ``sent`` (as sender: bytes, MSS, error).
    """
    cfg = ctx.config
    transfers = [Transfer.parse(i, raw, ctx.world_size) for i, raw in enumerate(cfg.get("transfers", []))]
    port = int(cfg.get("port", TCP_PORT))
    start_mono = _monotonic_at(float(cfg.get("start_wall") or time.time() + START_LEAD_S))
    inbound = [t for t in transfers if t.dst == ctx.rank and not t.dial_back]
    pulled = [t for t in transfers if t.src == ctx.rank and t.dial_back]
    receiver = _Receiver(ctx.spec.peers[ctx.rank], port, inbound, pulled, start_mono)
    receiver.thread.start()
    outbound = [t for t in transfers if t.src == ctx.rank and not t.dial_back]
    dialled = [t for t in transfers if t.dst == ctx.rank and t.dial_back]
    sent: list[dict[str, Any]] = [{} for _ in outbound]
    pulls: list[dict[str, Any]] = [{} for _ in dialled]

    def send(k: int, t: Transfer) -> None:
        sent[k] = _send_transfer(ctx.spec.peers, port, ctx.rank, t, start_mono)

    def pull(k: int, t: Transfer) -> None:
        pulls[k] = _pull_transfer(ctx.spec.peers, port, ctx.rank, t, start_mono)

    # one thread per transfer, each waiting for its own start: transfers that start together (a node
    # sending to all its peers at once, to measure its shared uplink) run at the same time
    threads = [threading.Thread(target=send, args=(k, t), daemon=True) for k, t in enumerate(outbound)]
    threads += [threading.Thread(target=pull, args=(k, t), daemon=True) for k, t in enumerate(dialled)]
    try:
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        end = start_mono + max((t.at_s + t.seconds for t in [*inbound, *pulled]), default=0.0) + 5.0
        while not receiver.done() and time.monotonic() < end:
            time.sleep(0.05)
    finally:
        receiver.close()
    with receiver.lock:
        results = {**receiver.results, **{p["index"]: p for p in pulls if p}}
        sent += [receiver.sent.get(t.index, {"index": t.index, "dst": t.dst, "sent_bytes": 0, "mss": 0,
                                             "error": "the receiver never connected"}) for t in pulled]
    inbound += dialled
    received = [
        results.get(t.index, {"index": t.index, "src": t.src, "dst": t.dst, "error": "no connection arrived"})
        for t in inbound
    ]
    return {"rank": ctx.rank, "received": received, "sent": sent, "errors": receiver.errors}


# -- TCP request/response RTT (fallback) ---------------------------------------------------------
def _echo_forever(conn: socket.socket, size: int) -> None:
    with conn:
        conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with contextlib.suppress(OSError, ConnectionError):
            while True:
                conn.sendall(_recv_exact(conn, size))


def _rtt_samples(
    address: tuple[str, int], source: str, *, count: int, size: int, interval: float, until: float
) -> dict[str, Any]:
    t0 = time.monotonic()
    with _connect_retrying(address, until=until, source=source) as sock:
        connect_us = (time.monotonic() - t0) * 1e6
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        sock.settimeout(10.0)
        samples: list[float] = []
        message = b"\x01" * size
        for _ in range(count):
            t = time.monotonic()
            sock.sendall(message)
            _recv_exact(sock, size)
            samples.append((time.monotonic() - t) * 1e6)
            time.sleep(max(0.0, interval - (time.monotonic() - t)))
    return {"connect_us": connect_us, "rtt_us": summary(samples)}


def tcp_rtt(ctx: JobContext) -> dict[str, Any]:
    """Round trips of ``size``-byte messages over one TCP connection per pair (one target at a time).

    Config: ``pairs``, ``count`` (default 100), ``interval_s`` (default 0.005), ``size`` (default
    64), ``port``, ``start_wall``, ``stop_wall`` (when the echo servers stop; default: after the
    longest prober's share at ``interval_s`` plus 50 ms per round trip, plus 2 s).
    """
    cfg = ctx.config
    pairs = _pairs(cfg.get("pairs"), ctx.world_size)
    count, size = int(cfg.get("count", 100)), int(cfg.get("size", 64))
    interval, port = float(cfg.get("interval_s", 0.005)), int(cfg.get("port", RTT_PORT))
    start_wall = float(cfg.get("start_wall") or time.time() + START_LEAD_S)
    longest = max((sum(1 for s, _ in pairs if s == r) for r in range(ctx.world_size)), default=0)
    stop_wall = float(cfg.get("stop_wall") or start_wall + longest * count * (interval + 0.05) + 2.0)
    own = ctx.spec.peers[ctx.rank]
    server = socket.create_server((own, port), backlog=64)
    server.settimeout(0.2)
    stop = threading.Event()
    threading.Thread(target=_accept_loop, args=(server, stop, lambda conn: _echo_forever(conn, size)),
                     daemon=True).start()
    results: dict[str, Any] = {}
    try:
        _sleep_until(_monotonic_at(start_wall))
        for d in (d for s, d in pairs if s == ctx.rank):
            try:
                results[str(d)] = _rtt_samples((ctx.spec.peers[d], port), own, count=count, size=size,
                                               interval=interval, until=time.monotonic() + 5.0)
            except OSError as exc:
                results[str(d)] = {"error": f"{type(exc).__name__}: {exc}"}
        _sleep_until(min(_monotonic_at(stop_wall), time.monotonic() + max(0.0, ctx.time_left() - 1.0)))
    finally:
        stop.set()
        server.close()
    return {"rank": ctx.rank, "targets": results}
