"""What the report shows of a user's program beyond a protocol's figures: its ranks, restarts and links.

A program's cell is an ordinary trace (its figures, each with the bytes its rank had sent), so the
summary, the comparison at the target and the plots treat it like a protocol. Its
``meta.program`` (written by :mod:`squall.experiment.program`) adds what only a program has: each
rank's runs (how each ended, its exit code, restarts after churn, where its logs are, where it was blocked
when its stack was taken); every cell's ``meta.links`` holds each directed link's bytes, packets and drops
counted in the kernel; the faults it went through, a hang and ranks that disagreed are listed under it.
"""

from __future__ import annotations

from collections.abc import Sequence

from squall.checks.liveness import fault_outcome
from squall.checks.recovery import describe
from squall.run_trace import RunTrace

RANKS_HEAD = ["rank", "runs", "ended", "exit code", "restarts", "sent", "received", "logs", "blocked in"]


def _mb(n: float) -> str:
    return f"{n / 1e6:.3g} MB" if n >= 1e5 else f"{n / 1e3:.3g} KB"


def ranks_rows(trace: RunTrace) -> list[list[str]]:
    """One row per rank: its runs, how the last ended, its exit code, restarts, bytes sent and received, logs."""
    runs = trace.meta.program.runs if trace.meta.program is not None else ()
    sent, got = rank_bytes(trace)
    rows = []
    for rank in range(trace.workers):
        mine = sorted((r for r in runs if r.rank == rank), key=lambda r: r.restart)
        last = mine[-1] if mine else None
        stack = trace.meta.stack(rank)
        blocked = "-" if stack is None else (stack.blocked_in or f"no stack: {stack.error}" if stack.error
                                             else stack.blocked_in or "-")
        rows.append([str(rank), str(len(mine)), last.state if last else "-",
                     str(last.exit_code) if last else "-", str(max(0, len(mine) - 1)), _mb(sent[rank]), _mb(got[rank]),
                     last.logs if last else "-", blocked])
    return rows


def rank_bytes(trace: RunTrace) -> tuple[list[int], list[int]]:
    """By rank: the bytes its node sent to and received from other nodes (a node's ranks share its count)."""
    sent, got = trace.meta.sent(trace.nodes), trace.meta.received(trace.nodes)
    return [sent[trace.node_of(r)] for r in range(trace.workers)], [got[trace.node_of(r)] for r in range(trace.workers)]


def node_lines(trace: RunTrace) -> list[str]:
    """With several ranks per node, one line per node: its ranks, its bytes to and from other nodes, and inside."""
    if trace.meta.nproc_per_node == 1:
        return []
    return [f"node {n.node} (ranks {', '.join(map(str, n.ranks))}): {_mb(n.sent)} sent to other nodes, "
            f"{_mb(n.received)} received from them, "
            + ("inside not read" if n.inside is None else f"{_mb(n.inside)} inside (loopback: its ranks' traffic)")
            for n in trace.meta.node_bytes(trace.nodes)]


def link_matrix(trace: RunTrace) -> tuple[list[str], list[list[str]]]:
    """Bytes per directed link as a matrix (row: sender, column: receiver), with drops where there were any."""
    cells = {(link.src, link.dst): (link.bytes, link.packets, link.dropped) for link in trace.meta.links}
    head = ["from \\ to", *(str(d) for d in range(trace.nodes))]
    rows = []
    for src in range(trace.nodes):
        row = [str(src)]
        for dst in range(trace.nodes):
            if src == dst:
                row.append("-")
                continue
            size, _, dropped = cells.get((src, dst), (0, 0, 0))
            row.append(_mb(size) + (f" ({dropped} dropped)" if dropped else ""))
        rows.append(row)
    return head, rows


def restart_marks(trace: RunTrace) -> list[str]:
    """One line per restart the profile's churn caused, per fault (and the recovery after it), the hang
    and each stack taken, and each ``--agree`` figure that differed."""
    lines = [f"churn: {c.t:.1f} s: {c.kind} of rank(s) {', '.join(map(str, c.nodes))}" for c in trace.churn
             if c.kind in ("kill", "restart")]
    word = fault_outcome(trace.meta)
    if word:
        lines.append(f"outcome: {word}")
    lines += [f"fault: {line}" for line in describe(trace.meta.faults)]
    if trace.meta.hang is not None:
        lines.append(f"HUNG: {trace.meta.hang.describe()}")
    lines += [f"stack of rank {s.rank} ({s.why}, {s.taken_s:.1f} s): "
              + (f"blocked in {s.blocked_in}, {s.threads} threads, in {s.path}" if not s.error else s.error)
              for s in trace.meta.stacks]
    lines += [f"DIVERGED: {a.why}" for a in trace.meta.agreement if a.passed is False]
    return lines


def cell_state(trace: RunTrace, word: str) -> str:
    """A summary's verdict word, marked ``HUNG`` or ``DIVERGED`` when the run was (not merely slow)."""
    if trace.meta.hang is not None:
        return f"{word} (HUNG)"
    if any(a.passed is False for a in trace.meta.agreement):
        return f"{word} (DIVERGED)"
    return word


def program_sections(cells: Sequence[tuple[str, RunTrace]]) -> list[tuple[str, str, list[list[str]],
                                                                          tuple[list[str], list[list[str]]],
                                                                          list[str]]]:
    """Per program cell: (cell id, command, ranks rows, link matrix, restart lines)."""
    out = []
    for cell_id, trace in cells:
        program = trace.meta.program
        if program is None:
            continue
        spec = program.spec
        command = " ".join(str(w) for w in spec.get("command") or [])
        marks = [*node_lines(trace), *restart_marks(trace)]
        out.append((cell_id, command, ranks_rows(trace), link_matrix(trace), marks))
    return out
