"""Results of a job on the nodes of a cluster, read from the files the workers wrote."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass(frozen=True)
class JobResult:
    """What one node's run of a job left behind."""

    node: int  # node index
    job_id: str  # the job's id
    state: str  # "done"; "timeout" (cancelled at the deadline); "lost" (the agent went away);
    # "cancelled" (the run was stopped, e.g. by SIGINT/SIGTERM, and the job killed)
    exit_code: int | None  # the worker's exit code when done
    duration_s: float | None  # wall time of the worker process, from the agent
    out_dir: Path  # host path of the job's output directory

    @property
    def ok(self) -> bool:
        """True when the job finished with exit code 0."""
        return self.state == "done" and self.exit_code == 0

    def result(self) -> dict[str, Any] | None:
        """The worker's result.json (``{"ok", "value" | "error", "duration_s"}``), or None."""
        path = self.out_dir / "result.json"
        return json.loads(path.read_text()) if path.exists() else None

    @property
    def value(self) -> Any:
        """The entry point's return value (None when it failed)."""
        res = self.result()
        return res.get("value") if res else None

    def metrics(self) -> list[dict[str, Any]]:
        """The records of metrics.jsonl; a truncated last line (crash mid-write) is dropped."""
        path = self.out_dir / "metrics.jsonl"
        if not path.exists():
            return []
        records = []
        for line in path.read_text().splitlines():
            try:
                records.append(json.loads(line))
            except ValueError:
                continue
        return records

    def log(self) -> str:
        """The job's stdout/stderr."""
        path = self.out_dir / "log.txt"
        return path.read_text(errors="replace") if path.exists() else ""

    def describe(self) -> str:
        """One line for error messages: state, exit code, the error and the log's tail."""
        res = self.result() or {}
        tail = " | ".join(self.log().strip().splitlines()[-3:])
        return (f"node {self.node}: {self.state}, exit {self.exit_code}, "
                f"error={res.get('error')!r}, log tail: {tail[-400:]}")
