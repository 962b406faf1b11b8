"""The real-time change executor: sends pre-encoded in-place changes at their due times.

A :class:`Schedule` is every change of a run, planned and encoded beforehand
(:mod:`squall.shaping.planning.changes`, :mod:`squall.shaping.planning.tc_messages`): per change its
time from the run's start, the netlink batch of each namespace, and for the nfqueue backend the
delay daemon's new link parameters. It is handed over (the process started, its sockets opened)
before the run starts; the start itself is one number on ``CLOCK_MONOTONIC`` (the same clock in
every process of the host), so starting costs nothing. Whoever runs it does nothing at a due time
but send:

* the netem backend starts ``python -m squall.shaping.clock.sender`` (:class:`ScheduleProcess`), one
  small process at ``SCHED_FIFO`` holding one ``NETLINK_ROUTE`` socket per namespace, opened
  before the run starts; it sleeps until each due time, sends, reads the kernel's acks and reports
  when each change was done (one JSON line on stdout);
* the nfqueue backend hands the schedule to its delay daemon (already ``SCHED_FIFO``), which keeps
  it in the :class:`Agenda` its event loop arms its timer with, sets the link parameters and sends
  the HTB changes from its own loop (:mod:`squall.shaping.nfqueue.daemon`).

A busy host then delays a change only as long as the kernel takes to wake a real-time task: no
interpreter lock of the harness, no plan or diff, no namespace to enter, no subprocess. The
schedule file is written by the harness into its own work directory; the executor reads it as its
own configuration (it is never bytes from a peer). The process exits when its standard input
closes (the harness stopped or died), so nothing outlives the run.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import json
import logging
import os
import select
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from squall.shaping.base import ShapingError
from squall.shaping.kernel.netlink import NETLINK_ROUTE, NLMSG_ERROR, NLMSGHDR
from squall.shaping.kernel.netns import Namespace
from squall.shaping.planning.tc_messages import split, with_seq

logger = logging.getLogger(__name__)

ACK_TIMEOUT_S: Final = 1.0  # rtnetlink answers inside the send; this only bounds a broken socket
READY_TIMEOUT_S: Final = 20.0  # the executor imports, opens its sockets and says ready
DEFAULT_PRIORITY: Final = 20  # SCHED_FIFO priority: above the delay daemon's default (10)


@dataclass(frozen=True)
class NamespaceRef:
    """A namespace the schedule sends to, pinned by identity (a reused pid is refused)."""

    path: str  # /proc/<pid>/ns/net
    dev: int  # st_dev of the namespace file when planned
    ino: int  # st_ino


@dataclass(frozen=True)
class ScheduleEntry:
    """One change: when, what, and what to send where."""

    index: int  # position in the run's changes (0 is the state applied before the start)
    due_ns: int  # nanoseconds after the run's start (in a schedule file); CLOCK_MONOTONIC once started
    label: str  # what brought it
    sends: tuple[tuple[str, bytes], ...] = ()  # (namespace key, netlink batch)
    links: tuple[Mapping[str, Any], ...] = ()  # the delay daemon's set_links items (nfqueue)


@dataclass(frozen=True)
class Schedule:
    """A run's changes, in due order, and the namespaces they go to."""

    namespaces: Mapping[str, NamespaceRef]
    entries: tuple[ScheduleEntry, ...]

    def to_json(self) -> str:
        """One JSON document (batches as hex)."""
        return json.dumps({
            "namespaces": {key: [ref.path, ref.dev, ref.ino] for key, ref in self.namespaces.items()},
            "entries": [{"index": e.index, "due_ns": e.due_ns, "label": e.label,
                         "sends": [[key, batch.hex()] for key, batch in e.sends], "links": list(e.links)}
                        for e in self.entries],
        })

    @staticmethod
    def from_json(text: str | bytes) -> Schedule:
        """Read :meth:`to_json`'s output; ValueError names what is wrong."""
        data = json.loads(text)
        if not isinstance(data, dict) or not isinstance(data.get("entries"), list):
            raise ValueError("a schedule is an object with 'namespaces' and 'entries'")
        namespaces = {}
        for key, ref in dict(data.get("namespaces", {})).items():
            if not (isinstance(ref, list) and len(ref) == 3 and isinstance(ref[0], str)
                    and all(isinstance(v, int) for v in ref[1:])):
                raise ValueError(f"namespace {key!r}: expected [path, dev, ino]")
            namespaces[str(key)] = NamespaceRef(ref[0], ref[1], ref[2])
        entries = []
        last = -1
        for i, item in enumerate(data["entries"]):
            if not isinstance(item, dict) or not isinstance(item.get("due_ns"), int):
                raise ValueError(f"entries[{i}]: expected an object with an integer due_ns")
            if item["due_ns"] < last:
                raise ValueError(f"entries[{i}]: not in due order")
            last = item["due_ns"]
            sends = []
            for key, batch in item.get("sends", []):
                if key not in namespaces:
                    raise ValueError(f"entries[{i}]: unknown namespace {key!r}")
                raw = bytes.fromhex(batch)
                split(raw)  # a malformed batch is refused before the run, not at its due time
                sends.append((str(key), raw))
            links = item.get("links", [])
            if not isinstance(links, list) or not all(isinstance(x, dict) for x in links):
                raise ValueError(f"entries[{i}].links: expected a list of objects")
            entries.append(ScheduleEntry(int(item.get("index", i)), item["due_ns"], str(item.get("label", "")),
                                         tuple(sends), tuple(links)))
        return Schedule(namespaces, tuple(entries))


@dataclass(frozen=True)
class Applied:
    """When one change was done, and what went wrong with it."""

    index: int  # the entry's index
    due_ns: int  # when it was due
    done_ns: int  # when its last send was acknowledged (CLOCK_MONOTONIC)
    errors: tuple[str, ...] = ()  # per failed send: the namespace and the kernel's reason

    @property
    def lateness_s(self) -> float:
        """Seconds between the due time and the change being done."""
        return (self.done_ns - self.due_ns) / 1e9

    def to_dict(self) -> dict[str, Any]:
        """Plain data."""
        return dataclasses.asdict(self)

    @staticmethod
    def from_dict(data: Mapping[str, Any]) -> Applied:
        """The inverse of :meth:`to_dict`."""
        return Applied(int(data["index"]), int(data["due_ns"]), int(data["done_ns"]),
                       tuple(str(e) for e in data.get("errors", ())))


class Agenda:
    """The entries not yet due, for an event loop: the next due time, and those due by now."""

    def __init__(self, entries: Sequence[ScheduleEntry], start_ns: int = 0):
        """:param start_ns: the run's start on ``CLOCK_MONOTONIC``; each entry's ``due_ns`` counts from it."""
        shifted = [dataclasses.replace(e, due_ns=start_ns + e.due_ns) for e in entries]
        self._entries = sorted(shifted, key=lambda e: (e.due_ns, e.index))
        self._next = 0

    def next_due_ns(self) -> int | None:
        """When the next entry is due; None when none is left."""
        return self._entries[self._next].due_ns if self._next < len(self._entries) else None

    def due(self, now_ns: int) -> list[ScheduleEntry]:
        """The entries due by ``now_ns``, in order (each is returned once)."""
        start = self._next
        while self._next < len(self._entries) and self._entries[self._next].due_ns <= now_ns:
            self._next += 1
        return self._entries[start:self._next]

    def __len__(self) -> int:
        return len(self._entries) - self._next


class NetlinkSenders:
    """One ``NETLINK_ROUTE`` socket per namespace, opened once; sends a batch and reads its acks."""

    def __init__(self, namespaces: Mapping[str, NamespaceRef]):
        self._socks: dict[str, socket.socket] = {}
        self._seq = 0
        try:
            for key, ref in namespaces.items():
                namespace = Namespace(ref.path)
                if namespace.identity != (ref.dev, ref.ino):
                    raise ShapingError(f"{ref.path} is no longer the namespace the schedule was planned for")
                with namespace.entered():
                    sock = socket.socket(socket.AF_NETLINK, socket.SOCK_RAW, NETLINK_ROUTE)
                sock.bind((0, 0))
                sock.settimeout(ACK_TIMEOUT_S)
                self._socks[key] = sock
        except BaseException:
            self.close()
            raise

    def send(self, key: str, batch: bytes) -> list[str]:
        """Send ``batch`` (numbered afresh) into namespace ``key``; return an error per refused request."""
        messages = split(batch)
        first = self._seq + 1
        numbered = b"".join(with_seq(m, first + i) + b"\0" * (-len(m) % 4) for i, m in enumerate(messages))
        self._seq += len(messages)
        sock = self._socks[key]
        try:
            sock.send(numbered)
            return _acks(sock, range(first, first + len(messages)), key)
        except OSError as exc:
            return [f"{key}: {exc.strerror or exc}"]

    def close(self) -> None:
        """Close every socket."""
        for sock in self._socks.values():
            sock.close()
        self._socks.clear()


def _acks(sock: socket.socket, seqs: range, key: str) -> list[str]:
    """Read until every request in ``seqs`` is acknowledged; the errors among them."""
    waiting = set(seqs)
    errors: list[str] = []
    while waiting:
        data = sock.recv(65536)
        offset = 0
        while offset + NLMSGHDR.size <= len(data):
            length, kind, _, seq, _ = NLMSGHDR.unpack_from(data, offset)
            if kind == NLMSG_ERROR and seq in waiting and offset + NLMSGHDR.size + 4 <= len(data):
                waiting.discard(seq)
                code = -int.from_bytes(data[offset + 16:offset + 20], sys.byteorder, signed=True)
                if code:
                    errors.append(f"{key}: request {seq - seqs.start}: {os.strerror(code)}")
            offset += max(NLMSGHDR.size, (length + 3) & ~3)
    return errors


def apply_entry(entry: ScheduleEntry, senders: NetlinkSenders,
                set_links: Callable[[Sequence[Mapping[str, Any]]], object] | None = None) -> Applied:
    """Do one change: the daemon's parameters first (they take no time), then each namespace's batch."""
    errors: list[str] = []
    if entry.links and set_links is not None:
        try:
            set_links(entry.links)
        except Exception as exc:  # the sends still go out; the error is recorded with the change
            errors.append(f"set_links: {exc}")
    for key, batch in entry.sends:
        errors += senders.send(key, batch)
    return Applied(entry.index, entry.due_ns, time.monotonic_ns(), tuple(errors))


# ----------------------------------------------------------------------------- the executor process


def _go_realtime(priority: int) -> None:
    if priority <= 0:
        return
    try:
        os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(priority))
    except OSError as exc:
        logger.warning("cannot run as SCHED_FIFO %d (%s): changes will be late under CPU load", priority, exc)


def _emit(record: Mapping[str, Any]) -> None:
    sys.stdout.write(json.dumps(record) + "\n")
    sys.stdout.flush()


def _start_of(stdin: int) -> int | None:
    """Wait for ``go START_NS`` on ``stdin``; None when it says ``stop`` or closes first."""
    buffer = b""
    while b"\n" not in buffer:
        chunk = os.read(stdin, 4096)
        if not chunk:
            return None
        buffer += chunk
    words = buffer.split(b"\n", 1)[0].split()
    if len(words) == 2 and words[0] == b"go" and words[1].isdigit():
        return int(words[1])
    return None


def serve(schedule: Schedule, stdin: int) -> int:
    """Open the sockets, say ready, wait for ``go START_NS``, run the schedule from that start; stop
    early when ``stdin`` says ``stop`` or closes. Returns the exit status."""
    senders = NetlinkSenders(schedule.namespaces)
    _emit({"ready": True, "entries": len(schedule.entries)})
    buffer = b""
    try:
        start_ns = _start_of(stdin)
        if start_ns is None:
            return 0
        agenda = Agenda(schedule.entries, start_ns)
        while True:
            due = agenda.next_due_ns()
            timeout = None if due is None else max(0.0, (due - time.monotonic_ns()) / 1e9)
            readable, _, _ = select.select([stdin], [], [], timeout)
            if readable:
                chunk = os.read(stdin, 4096)
                buffer += chunk
                if not chunk or b"stop" in buffer:
                    return 0
                continue
            for entry in agenda.due(time.monotonic_ns()):
                _emit(apply_entry(entry, senders).to_dict())
            if due is None:
                return 0
    finally:
        senders.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m squall.shaping.clock.sender --schedule FILE [--realtime N]``."""
    parser = argparse.ArgumentParser(prog="python -m squall.shaping.clock.sender", description=__doc__.splitlines()[0])
    parser.add_argument("--schedule", required=True, help="the schedule file (JSON, written by the harness)")
    parser.add_argument("--realtime", type=int, default=DEFAULT_PRIORITY, help="SCHED_FIFO priority; 0 = normal")
    args = parser.parse_args(argv)
    logging.basicConfig(level="WARNING", format="change-executor %(levelname)s %(message)s", stream=sys.stderr)
    schedule = Schedule.from_json(Path(args.schedule).read_bytes())
    _go_realtime(args.realtime)
    try:
        return serve(schedule, sys.stdin.fileno())
    except ShapingError as exc:
        _emit({"failed": str(exc)})
        return 1


class ScheduleProcess:
    """The harness's side of the executor process: start it, collect what it did, stop it."""

    def __init__(self, schedule: Schedule, workdir: Path, *, realtime: int = DEFAULT_PRIORITY):
        self.path = workdir / f"schedule-{os.getpid()}-{time.monotonic_ns()}.json"
        self.path.write_text(schedule.to_json())
        self._applied: list[Applied] = []
        self._failed: str | None = None
        self._lock = threading.Lock()
        self._ready = threading.Event()
        self._proc = subprocess.Popen(
            [sys.executable, "-m", "squall.shaping.clock.sender", "--schedule", str(self.path),
             "--realtime", str(realtime)],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
        )
        self._reader = threading.Thread(target=self._read, name="squall-change-results", daemon=True)
        self._reader.start()
        if not self._ready.wait(READY_TIMEOUT_S) or self._failed is not None:
            problem = self._failed or f"not ready within {READY_TIMEOUT_S:g} s"
            self.stop()
            raise ShapingError(f"the change executor did not start: {problem}")

    def _read(self) -> None:
        assert self._proc.stdout is not None
        for line in self._proc.stdout:
            try:
                record = json.loads(line)
            except ValueError:
                continue
            with self._lock:
                if record.get("ready"):
                    self._ready.set()
                elif "failed" in record:
                    self._failed = str(record["failed"])
                else:
                    self._applied.append(Applied.from_dict(record))
        if not self._ready.is_set():
            err = self._proc.stderr.read().decode(errors="replace") if self._proc.stderr else ""
            self._failed = self._failed or (err.strip().splitlines() or ["exited"])[-1]
            self._ready.set()

    def go(self, start_ns: int) -> None:
        """Start the run's clock: each entry is due ``due_ns`` after ``start_ns`` (``CLOCK_MONOTONIC``)."""
        try:
            assert self._proc.stdin is not None
            self._proc.stdin.write(f"go {start_ns}\n".encode())
            self._proc.stdin.flush()
        except (OSError, ValueError) as exc:
            raise ShapingError(f"the change executor is gone: {exc}") from exc

    def applied(self) -> list[Applied]:
        """The changes done so far."""
        with self._lock:
            return list(self._applied)

    def stop(self) -> list[Applied]:
        """Cancel what is not due yet, wait for the process, remove the schedule file; everything done."""
        if self._proc.poll() is None:
            with contextlib.suppress(OSError, ValueError):
                assert self._proc.stdin is not None
                self._proc.stdin.write(b"stop\n")
                self._proc.stdin.close()
            try:
                self._proc.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._reader.join(timeout=5)
        with contextlib.suppress(OSError):
            self.path.unlink()
        for stream in (self._proc.stdin, self._proc.stdout, self._proc.stderr):
            if stream is not None:
                with contextlib.suppress(OSError, ValueError):
                    stream.close()
        return self.applied()


@contextlib.contextmanager
def running(schedule: Schedule, workdir: Path) -> Iterator[ScheduleProcess]:
    """A :class:`ScheduleProcess` stopped on the way out."""
    process = ScheduleProcess(schedule, workdir)
    try:
        yield process
    finally:
        process.stop()


if __name__ == "__main__":
    sys.exit(main())
