"""What a run records besides its step records: one frozen type, read by name, written to results files.

Every cell (a protocol's or a program's) carries a :class:`RunMeta` in its
:class:`~squall.run_trace.RunTrace`: the budget, the timeline as it was realised, the links' kernel
counts, where each node ran, and what went wrong. A program's run adds a :class:`ProgramMeta` (its
command, every rank's runs, the bytes it had sent second by second). :meth:`RunMeta.to_json` and
:meth:`RunMeta.from_json` round-trip through ``results.json``; a key a newer Squall wrote and this one
does not know is kept in :attr:`RunMeta.extra`, never dropped.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

#: How one run of one rank of a program ended.
STATES = {
    "exited": "exited by itself (see the exit code)",
    "budget": "still running at the end of its budget: stopped (SIGTERM, then SIGKILL)",
    "stopped": "stopped because another rank failed",
    "killed": "its container was killed by the profile's churn",
    "lost": "its agent went away (the container died) without churn to explain it",
    "error": "could not be started",
    "hung": "stopped by Squall: no rank printed a line and the links carried only a trickle (--hang-after)",
}


@dataclass(frozen=True)
class RankRun:
    """One run of one rank of a program (a rank restarted by churn has several)."""

    rank: int  # the rank (= worker index)
    restart: int  # 0 for the first start, then 1, 2... (TORCHELASTIC_RESTART_COUNT)
    state: str  # one of STATES
    exit_code: int | None  # the program's exit code when it exited by itself or was stopped
    duration_s: float | None  # how long it ran
    stderr_tail: tuple[str, ...] = ()  # its last lines of stderr
    logs: str = ""  # the folder holding its stdout.txt, stderr.txt and out/
    ended_s: float | None = None  # seconds after the run started that the host saw it end

    def __post_init__(self) -> None:
        if self.state not in STATES:
            raise ValueError(f"rank state {self.state!r}; allowed: {sorted(STATES)}")

    @property
    def failed(self) -> bool:
        """Whether this run is a failure of the program (not of the network's churn, not a stop by Squall)."""
        return (self.state == "exited" and self.exit_code != 0) or self.state in ("error", "lost")

    def describe(self) -> str:
        """``rank 2 exited with exit code 1; last lines of its stderr: ...``."""
        what = {"exited": f"exited with {_code(self.exit_code)}", "error": "could not be started",
                "lost": "was lost (its container went away)", "budget": "was still running at its budget",
                "stopped": "was stopped after another rank failed", "killed": "was killed by churn",
                "hung": "was stopped as hung"}[self.state]
        again = f" (restart {self.restart})" if self.restart else ""
        tail = " | ".join(self.stderr_tail[-5:])
        return f"rank {self.rank}{again} {what}" + (f"; last lines of its stderr: {tail}" if tail else "")

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "restart": self.restart, "state": self.state, "exit_code": self.exit_code,
                "duration_s": self.duration_s, "stderr_tail": list(self.stderr_tail), "logs": self.logs,
                "ended_s": self.ended_s}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> RankRun:
        return cls(int(row["rank"]), int(row.get("restart", 0)), str(row["state"]), row.get("exit_code"),
                   row.get("duration_s"), tuple(row.get("stderr_tail") or ()), str(row.get("logs", "")),
                   row.get("ended_s"))


def _code(code: int | None) -> str:
    if code is None:
        return "no exit code"
    return f"signal {-code}" if code < 0 else f"exit code {code}"


@dataclass(frozen=True)
class RankStack:
    """Every thread's Python stack of one rank, taken with py-spy from the host (or why it could not be)."""

    rank: int  # the rank (= node index)
    restart: int  # which run of the rank (0: the first)
    why: str  # "hung" (taken before the run was stopped as hung) or "budget" (still running at its end)
    taken_s: float  # seconds after the run started
    blocked_in: str  # the main thread's innermost frame, "function (file:line)"; "" when unknown
    threads: int  # how many threads the dump shows
    path: str  # the file holding the dump (the rank's results folder), "" when there is none
    text: str  # py-spy's output
    error: str = ""  # why there is no stack (py-spy missing, could not attach...); "" when there is one

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> RankStack:
        return cls(int(row["rank"]), int(row.get("restart", 0)), str(row.get("why", "")),
                   float(row.get("taken_s", 0.0)), str(row.get("blocked_in", "")), int(row.get("threads", 0)),
                   str(row.get("path", "")), str(row.get("text", "")), str(row.get("error", "")))


@dataclass(frozen=True)
class Hang:
    """A run stopped because nothing moved: no rank printed a line, the links carried only a trickle."""

    after_s: float  # the quiet it took (--hang-after)
    trickle_bps: float  # bytes per second over all links that still count as quiet
    quiet_since_s: float  # seconds after the start: the last line or the last traffic above the trickle
    stopped_s: float  # seconds after the start: when the ranks were stopped
    last_line_s: float | None  # seconds after the start of the last line any rank printed (None: no line)
    last_rank: int | None  # the rank that printed it

    def describe(self) -> str:
        """``hung since 12.3 s (no line and under 1000 B/s on the links for 30 s); rank 2 printed last, at 12.1 s``."""
        last = ("no rank printed a line" if self.last_rank is None
                else f"rank {self.last_rank} printed last, at {self.last_line_s:.1f} s")
        return (f"hung since {self.quiet_since_s:.1f} s (no line printed and under {self.trickle_bps:g} B/s on the "
                f"links for {self.after_s:g} s; stopped at {self.stopped_s:.1f} s); {last}")

    def to_json(self) -> dict[str, Any]:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> Hang:
        return cls(float(obj["after_s"]), float(obj["trickle_bps"]), float(obj["quiet_since_s"]),
                   float(obj["stopped_s"]), obj.get("last_line_s"), obj.get("last_rank"))


@dataclass(frozen=True)
class FaultEvent:
    """One fault a run went through and whether (and when) the ranks made progress again after it."""

    kind: str  # kill, pause, link_down, partition, phase (loss or delay changed), ...
    nodes: tuple[int, ...]  # the nodes it struck (every node for a phase or a partition)
    at_s: float  # seconds after the start it began
    end_s: float | None  # when it ended (a restart, resume, link_up, heal, the next phase); None: never
    recovered_after_s: float | None  # from end_s until every surviving rank printed again; None: never did
    progressed: bool = False  # every surviving rank printed a figure while the fault lasted
    label: str = ""  # what the profile called it

    @property
    def outcome(self) -> str:
        """``survived``, ``recovered after 3.2 s``, ``never recovered`` or ``lasted to the end``."""
        if self.end_s is None:
            return "lasted to the end"
        if self.recovered_after_s is None:
            return "never recovered"
        if self.progressed:
            return "survived"
        return f"recovered after {self.recovered_after_s:.1f} s"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "nodes": list(self.nodes), "at_s": self.at_s, "end_s": self.end_s,
                "recovered_after_s": self.recovered_after_s, "progressed": self.progressed, "label": self.label}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> FaultEvent:
        return cls(str(row["kind"]), tuple(int(n) for n in row.get("nodes") or ()), float(row["at_s"]),
                   row.get("end_s"), row.get("recovered_after_s"), bool(row.get("progressed", False)),
                   str(row.get("label", "")))


@dataclass(frozen=True)
class Agreement:
    """Whether every rank that finished ended with the same value of one figure (``--agree NAME``)."""

    figure: str  # the figure's name
    tolerance: float  # relative tolerance for numbers (0: equal); texts must be equal
    values: tuple[tuple[int, float | str], ...]  # each finished rank's last value, by rank
    odd: tuple[int, ...]  # ranks outside the majority (empty when they agree)
    passed: bool | None  # True: agree; False: disagree; None: no rank printed the figure
    why: str  # one line

    def to_json(self) -> dict[str, Any]:
        return {"figure": self.figure, "tolerance": self.tolerance, "values": [[r, v] for r, v in self.values],
                "odd": list(self.odd), "passed": self.passed, "why": self.why}

    @classmethod
    def from_json(cls, row: Mapping[str, Any]) -> Agreement:
        return cls(str(row["figure"]), float(row.get("tolerance", 0.0)),
                   tuple((int(r), v) for r, v in row.get("values") or ()), tuple(int(r) for r in row.get("odd") or ()),
                   row.get("passed"), str(row.get("why", "")))


@dataclass(frozen=True)
class LinkCount:
    """One directed link's traffic over a whole run, counted in the kernel by the shaping backend."""

    src: int  # sending node
    dst: int  # receiving node
    bytes: int  # IP bytes that reached the link
    packets: int  # packets that reached the link
    dropped: int  # packets the emulation dropped (loss, a full queue, a cut link)

    def to_json(self) -> list[int]:
        return [self.src, self.dst, self.bytes, self.packets, self.dropped]

    @classmethod
    def from_json(cls, row: Sequence[Any]) -> LinkCount:
        src, dst, size, packets, dropped = (int(v) for v in row)
        return cls(src, dst, size, packets, dropped)


@dataclass(frozen=True)
class NodeBytes:
    """One node's traffic over a run: to and from other nodes (kernel link counts) and inside it (loopback)."""

    node: int  # the node (container) index
    ranks: tuple[int, ...]  # its global ranks: node * nproc_per_node + local rank
    sent: int  # IP bytes it sent to other nodes (the sum of its outgoing links)
    received: int  # IP bytes other nodes sent it (the sum of its incoming links)
    inside: int | None  # bytes its loopback device carried (its ranks' traffic to one another); None: not read

    def to_json(self) -> dict[str, Any]:
        return {"node": self.node, "ranks": list(self.ranks), "sent": self.sent, "received": self.received,
                "inside": self.inside}


@dataclass(frozen=True)
class ProgramMeta:
    """What only a user's program's run has."""

    spec: Mapping[str, Any]  # the program as ProgramSpec.to_json() wrote it (command, patterns, target...)
    runs: tuple[RankRun, ...]  # every rank's runs, restarts included
    samples: tuple[tuple[float, tuple[int, ...]], ...] = ()  # (seconds from the start, bytes each node had sent)
    duration_s: float | None = None  # from the first rank's start to the last one's end
    budget_s: float | None = None  # the program's hard budget
    stopped_after_failure_s: float | None = None  # when the ranks were stopped because one failed
    counter_errors: tuple[str, ...] = ()  # readings of the kernel counters that failed (gaps in samples)
    snapshot: Mapping[str, Any] = field(default_factory=dict)  # the folder's copy that ran: source, path, digest

    def to_json(self) -> dict[str, Any]:
        return {"spec": dict(self.spec), "runs": [r.to_json() for r in self.runs],
                "samples": [[t, list(sent)] for t, sent in self.samples], "duration_s": self.duration_s,
                "budget_s": self.budget_s, "stopped_after_failure_s": self.stopped_after_failure_s,
                "counter_errors": list(self.counter_errors), "snapshot": dict(self.snapshot)}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any]) -> ProgramMeta:
        return cls(spec=dict(obj.get("spec") or {}),
                   runs=tuple(RankRun.from_json(r) for r in obj.get("runs") or [] if isinstance(r, Mapping)),
                   samples=tuple((float(t), tuple(int(v) for v in sent)) for t, sent in obj.get("samples") or []),
                   duration_s=obj.get("duration_s"), budget_s=obj.get("budget_s"),
                   stopped_after_failure_s=obj.get("stopped_after_failure_s"),
                   counter_errors=tuple(str(e) for e in obj.get("counter_errors") or ()),
                   snapshot=dict(obj.get("snapshot") or {}))


@dataclass(frozen=True)
class RunMeta:
    """Everything a run records besides its step records (see the module docstring)."""

    startup_s: float = 0.0  # from the run's start to the first step record (process start-up, imports)
    budget_s: float | None = None  # the run's time budget
    budget_steps: int | None = None  # a protocol's step budget
    seed: int | None = None  # the run's seed
    task: str | None = None  # a protocol's training task
    lr: float | None = None  # a protocol's learning rate
    batch_size: int | None = None  # a protocol's per-worker batch
    failures: tuple[str, ...] = ()  # one line per failed run of a rank
    rejoined: tuple[int, ...] = ()  # nodes whose job was started again after churn restarted them
    summaries: tuple[Any, ...] = ()  # a protocol's per-node end summary (its job's return value), by node
    timeline: Mapping[str, Any] = field(default_factory=dict)  # the timeline as realised (experiment.realised)
    timeline_lateness_s: tuple[float, ...] = ()  # how late each link change and churn action was done
    profile_source: str = ""  # the profile's file
    engine: str = ""  # where the containers ran: local or swarm
    placement: tuple[str, ...] = ()  # the machine of each node
    clock_offsets_s: Mapping[str, float] = field(default_factory=dict)  # machine -> its clock's offset
    links: tuple[LinkCount, ...] = ()  # every directed link's kernel counts over the run
    bytes_source: str = "application"  # who counted the records' bytes_sent: the application or the kernel
    segments: Mapping[str, Any] | None = None  # a traced profile's per-segment calibration, when judged
    program: ProgramMeta | None = None  # what only a program's run has
    hang: Hang | None = None  # set when the run was stopped as hung (--hang-after)
    stacks: tuple[RankStack, ...] = ()  # ranks' stacks: at a hang, or still running at the end of the budget
    faults: tuple[FaultEvent, ...] = ()  # every fault the run went through, with the recovery after it
    agreement: tuple[Agreement, ...] = ()  # each --agree figure's outcome
    nproc_per_node: int = 1  # ranks per node: a record's worker is its global rank, its node rank // nproc_per_node
    loopback: tuple[int | None, ...] = ()  # by node: bytes its loopback device carried during the run (); not read
    extra: Mapping[str, Any] = field(default_factory=dict)  # keys this version does not know (kept, not read)

    def to_json(self) -> dict[str, Any]:
        """Plain data for results files."""
        out: dict[str, Any] = {}
        for f in dataclasses.fields(self):
            if f.name == "extra":
                continue
            value = getattr(self, f.name)
            if f.name == "links":
                value = [link.to_json() for link in value]
            elif f.name in ("program", "hang"):
                value = value.to_json() if value is not None else None
            elif f.name in ("stacks", "faults", "agreement"):
                value = [row.to_json() for row in value]
            elif isinstance(value, tuple):
                value = list(value)
            elif isinstance(value, Mapping):
                value = dict(value)
            out[f.name] = value
        return {**dict(self.extra), **out}

    @classmethod
    def from_json(cls, obj: Mapping[str, Any] | None) -> RunMeta:
        """The inverse of :meth:`to_json` (also for results files of older versions: missing keys take
        their defaults, unknown keys go to :attr:`extra`)."""
        obj = dict(obj or {})
        known = {f.name for f in dataclasses.fields(cls)} - {"extra"}
        values: dict[str, Any] = {}
        for name in known & set(obj):
            raw = obj[name]
            if name == "links":
                values[name] = tuple(LinkCount.from_json(row) for row in raw or [])
            elif name == "program":
                values[name] = ProgramMeta.from_json(raw) if isinstance(raw, Mapping) else None
            elif name == "hang":
                values[name] = Hang.from_json(raw) if isinstance(raw, Mapping) else None
            elif name in _ROWS:
                values[name] = tuple(_ROWS[name](row) for row in raw or () if isinstance(row, Mapping))
            elif name == "loopback":
                values[name] = tuple(None if v is None else int(v) for v in raw or ())
            elif name == "nproc_per_node":
                values[name] = int(raw or 1)
            elif name in ("failures", "timeline_lateness_s", "placement", "summaries"):
                values[name] = tuple(raw or ())
            elif name == "rejoined":
                values[name] = tuple(int(v) for v in raw or ())
            else:
                values[name] = raw
        return cls(**values, extra={k: v for k, v in obj.items() if k not in known})

    def stack(self, rank: int) -> RankStack | None:
        """The last stack taken of ``rank`` (None when none was)."""
        mine = [s for s in self.stacks if s.rank == rank]
        return mine[-1] if mine else None

    def sent(self, workers: int) -> list[int]:
        """Bytes each node sent over the whole run (the sum of its outgoing links), counted in the kernel."""
        out = [0] * workers
        for link in self.links:
            if 0 <= link.src < workers:
                out[link.src] += link.bytes
        return out

    def received(self, workers: int) -> list[int]:
        """Bytes each node received over the whole run (the sum of its incoming links)."""
        out = [0] * workers
        for link in self.links:
            if 0 <= link.dst < workers:
                out[link.dst] += link.bytes
        return out

    def node_bytes(self, nodes: int) -> tuple[NodeBytes, ...]:
        """Each node's bytes between nodes and inside it (:class:`NodeBytes`), with its global ranks."""
        sent, got, k = self.sent(nodes), self.received(nodes), self.nproc_per_node
        return tuple(NodeBytes(n, tuple(range(n * k, (n + 1) * k)), sent[n], got[n],
                               self.loopback[n] if n < len(self.loopback) else None) for n in range(nodes))


_ROWS: dict[str, Any] = {"stacks": RankStack.from_json, "faults": FaultEvent.from_json,
                         "agreement": Agreement.from_json}
