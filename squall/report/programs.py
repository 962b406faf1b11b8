"""What the report shows of a user's program beyond a protocol's figures: its ranks, restarts and links.

A program's cell is an ordinary trace (its figures, each with the bytes its rank had sent), so the
summary, the comparison at the target and the plots treat it like a protocol. Its
``meta.program`` (written by :mod:`squall.experiment.program`) adds what only a program has: each
rank's runs (how each ended, its exit code, restarts after churn, where its logs are); every cell's
``meta.links`` holds each directed link's bytes, packets and drops counted in the kernel.
"""

from __future__ import annotations

from collections.abc import Sequence

from squall.run_trace import RunTrace

RANKS_HEAD = ["rank", "runs", "ended", "exit code", "restarts", "sent", "received", "logs"]


def _mb(n: float) -> str:
    return f"{n / 1e6:.3g} MB" if n >= 1e5 else f"{n / 1e3:.3g} KB"


def ranks_rows(trace: RunTrace) -> list[list[str]]:
    """One row per rank: its runs, how the last ended, its exit code, restarts, bytes sent and received, logs."""
    runs = trace.meta.program.runs if trace.meta.program is not None else ()
    sent, got = trace.meta.sent(trace.workers), trace.meta.received(trace.workers)
    rows = []
    for rank in range(trace.workers):
        mine = sorted((r for r in runs if r.rank == rank), key=lambda r: r.restart)
        last = mine[-1] if mine else None
        rows.append([str(rank), str(len(mine)), last.state if last else "-",
                     str(last.exit_code) if last else "-", str(max(0, len(mine) - 1)), _mb(sent[rank]), _mb(got[rank]),
                     last.logs if last else "-"])
    return rows


def link_matrix(trace: RunTrace) -> tuple[list[str], list[list[str]]]:
    """Bytes per directed link as a matrix (row: sender, column: receiver), with drops where there were any."""
    cells = {(link.src, link.dst): (link.bytes, link.packets, link.dropped) for link in trace.meta.links}
    head = ["from \\ to", *(str(d) for d in range(trace.workers))]
    rows = []
    for src in range(trace.workers):
        row = [str(src)]
        for dst in range(trace.workers):
            if src == dst:
                row.append("-")
                continue
            size, _, dropped = cells.get((src, dst), (0, 0, 0))
            row.append(_mb(size) + (f" ({dropped} dropped)" if dropped else ""))
        rows.append(row)
    return head, rows


def restart_marks(trace: RunTrace) -> list[str]:
    """One line per restart the profile's churn caused: when, which rank, how many times."""
    return [f"{c.t:.1f} s: {c.kind} of rank(s) {', '.join(map(str, c.nodes))}" for c in trace.churn
            if c.kind in ("kill", "restart")]


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
        out.append((cell_id, command, ranks_rows(trace), link_matrix(trace), restart_marks(trace)))
    return out
