"""A node's run of several local ranks as one :class:`~squall.run_meta.RankRun` per global rank (pure).

With ``--nproc-per-node K`` each node's ``command`` job starts K local ranks (``squall/worker/local_ranks.py``)
and writes, per local rank, a ``program.json`` row: its global rank, how it ended (``exited``, ``budget``, or
``stopped`` when another local rank failed and the node's launcher stopped it, as torchrun does) and its exit
code. The host sees the job end as one node's run; :func:`split_node_run` makes the K runs the verdict, the
report and ``--json`` read, global rank ``node * K + local``:

* when the job ended by itself (``exited`` or ``budget``), each rank's own row decides (a rank without a
  row never started: ``error``);
* otherwise the node's end is every rank's: the churn killed the container (``killed``), its agent went
  away (``lost``), the host stopped it after another node failed (``stopped``) or as hung (``hung``), or the
  program could not start (``error``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from squall.run_meta import RankRun

#: States a local rank's row may give.
LOCAL_STATES = ("exited", "budget", "stopped")


def split_node_run(node_run: RankRun, nproc: int, rows: Sequence[Mapping[str, Any]],
                   logs: Sequence[str]) -> tuple[RankRun, ...]:
    """The runs of the ``nproc`` ranks of ``node_run.rank`` (a node index), from each local rank's row.

    :param rows: each local rank's ``program.json`` (by local rank; shorter when some are missing).
    :param logs: each local rank's results folder (by local rank).
    """
    if nproc < 1:
        raise ValueError(f"nproc must be >= 1, got {nproc}")
    if len(logs) != nproc:
        raise ValueError(f"{len(logs)} log folders for {nproc} local ranks")
    own = node_run.state in ("exited", "budget")
    out = []
    for local in range(nproc):
        rank = node_run.rank * nproc + local
        row = rows[local] if local < len(rows) else {}
        state = row.get("state")
        if own and state in LOCAL_STATES:
            code = row.get("exit_code")
            out.append(RankRun(rank, node_run.restart, str(state), code if isinstance(code, int) else None,
                               _seconds(row.get("duration_s"), node_run.duration_s),
                               tuple(str(line) for line in row.get("stderr_tail") or ()), logs[local],
                               node_run.ended_s))
        elif own:  # the launcher wrote no row for it: it never started
            out.append(RankRun(rank, node_run.restart, "error", None, None, node_run.stderr_tail, logs[local],
                               node_run.ended_s))
        else:
            out.append(RankRun(rank, node_run.restart, node_run.state,
                               node_run.exit_code if node_run.state != "exited" else None, node_run.duration_s,
                               node_run.stderr_tail if local == 0 else (), logs[local], node_run.ended_s))
    return tuple(out)


def _seconds(value: Any, default: float | None) -> float | None:
    if isinstance(value, int | float) and not isinstance(value, bool):
        return float(value)
    return default
