"""Process entry point of one job: read a spec, run its entry point, write metrics and a result.

Run by the agent in a forked child (the usual path, torch already imported), or by hand::

    python -m squall.worker.process SPEC.json

Files written to the spec's ``out_dir``: ``metrics.jsonl`` (the entry point's records),
``result.json`` (``{"ok": true, "value": ...}`` or ``{"ok": false, "error": ...}``); the agent also
sends stdout/stderr to ``log.txt`` there. Exit code 0 on success, 1 when the entry point raised,
2 for a bad spec.
"""

from __future__ import annotations

import json
import logging
import sys
import time
import traceback
from pathlib import Path
from typing import Any

from squall.job import JobContext, JobSpec, JobSpecError, MetricsWriter
from squall.worker.registry import UnknownEntry, resolve

logger = logging.getLogger("squall.worker.process")

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_BAD_SPEC = 2


def _write_result(out_dir: Path, result: dict[str, Any]) -> None:
    tmp = out_dir / "result.json.tmp"
    tmp.write_text(json.dumps(result, default=str))
    tmp.replace(out_dir / "result.json")


def run_job(obj: Any) -> int:
    """Run the job described by the decoded JSON ``obj``; return the process exit code."""
    try:
        spec = JobSpec.from_json(obj)
    except JobSpecError as exc:
        logger.error("bad job spec: %s", exc)
        return EXIT_BAD_SPEC
    out_dir = Path(spec.out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    started = time.monotonic()
    try:
        func = resolve(spec.entry)
    except UnknownEntry as exc:
        logger.error("%s", exc)
        _write_result(out_dir, {"ok": False, "error": str(exc), "duration_s": 0.0})
        return EXIT_BAD_SPEC
    logger.info("job %s: %s on rank %d/%d", spec.job_id, spec.entry, spec.rank, spec.world_size)
    with MetricsWriter(out_dir / "metrics.jsonl") as metrics:
        ctx = JobContext(spec=spec, out_dir=out_dir, metrics=metrics, started=started)
        try:
            value = func(ctx)
        except Exception as exc:
            logger.error("job %s failed:\n%s", spec.job_id, traceback.format_exc())
            _write_result(out_dir, {"ok": False, "error": f"{type(exc).__name__}: {exc}",
                                    "duration_s": time.monotonic() - started})
            return EXIT_FAILED
    _write_result(out_dir, {"ok": True, "value": value, "duration_s": time.monotonic() - started})
    logger.info("job %s done in %.3f s", spec.job_id, time.monotonic() - started)
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """``python -m squall.worker.process SPEC.json``."""
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        sys.stderr.write("usage: python -m squall.worker.process SPEC.json\n")
        return EXIT_BAD_SPEC
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    try:
        obj = json.loads(Path(args[0]).read_text())
    except (OSError, ValueError) as exc:
        logger.error("cannot read job spec %s: %s", args[0], exc)
        return EXIT_BAD_SPEC
    return run_job(obj)


if __name__ == "__main__":
    sys.exit(main())
