"""``squall run ... -- COMMAND``: a user's own program instead of a protocol, and ``squall image build
--requirements``.

Exit codes as for protocols: 0 pass, 1 fail or unknown, 2 bad usage (a malformed flag, a
requirement that cannot be installed), 3 environment not ready (no Docker engine, no worker image).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from squall.checks.recovery import describe
from squall.checks.verdict import Verdict
from squall.cluster.preflight import preflight
from squall.cluster.spec import MAX_WORKERS, default_engine, select_engine
from squall.experiment.fidelity import SessionCalibration
from squall.experiment.program import program_image
from squall.experiment.session import Session
from squall.profiles import load_profile
from squall.programs.result import VERDICTS, result_json
from squall.programs.spec import ProgramSpec, program_from_args
from squall.programs.verdict import judge
from squall.progress import Display
from squall.report import provenance
from squall.report.network import describe_profiles
from squall.report.page import CellResult, Results, write_report
from squall.run_trace import RunTrace
from squall.target import Target

DEFAULT_SECONDS = 60.0  # a program's budget when --seconds is not given


def cell_id(spec: ProgramSpec, profile: str, workers: int) -> str:
    """``train-thin_20mbit-w4``, like a protocol's cell."""
    from squall.experiment.matrix import Cell

    return Cell(spec.name, profile, workers).id()


def cmd_run_program(args: argparse.Namespace, command: Sequence[str]) -> int:
    """``squall run --workers N --profile P [--seconds S] [--metric ...] [--target ...] -- COMMAND``."""
    select_engine(args.engine)
    engine = default_engine()  # local, or swarm: the program's snapshot is copied to every node
    spec = program_from_args(command, metrics=args.metric or (), target=args.target, workdir=args.workdir,
                             requirements=args.requirements, pip=args.pip or (), name=args.name,
                             nproc_per_node=args.nproc_per_node,
                             exclude=args.exclude or (), agree=args.agree or ())
    profile = load_profile(args.profile)  # a bad profile or size is a usage error before anything starts
    if not profile.required_workers() <= args.workers <= MAX_WORKERS[engine]:
        raise ValueError(f"--workers: profile {profile.name!r} needs {profile.required_workers()}.."
                         f"{MAX_WORKERS[engine]} workers on the {engine} engine, got {args.workers}")
    profile.runnable_for(args.workers, engine=engine)
    seconds = args.seconds if args.seconds is not None else DEFAULT_SECONDS
    cid = cell_id(spec, args.profile, args.workers)
    preflight(args.backend, engine=args.engine)  # exit 3 with the reasons before anything starts
    display = Display(label=cid)
    t0, before = time.monotonic(), provenance.collect()
    report_dir: Path = args.report
    fidelity = SessionCalibration(enabled=args.calibrate, progress=display.line)
    try:
        with display.logging_above(), Session(backend=args.backend, observer=display, fidelity=fidelity,
                                              snapshots=report_dir / "snapshots") as cells:
            # a requirement that cannot be installed fails here, before any container starts
            cells.images[spec.requirements] = program_image(spec)
            run = cells.run_program(spec, args.profile, args.workers, seconds=seconds, seed=args.seed,
                                    logs=report_dir / "ranks", hang_after=args.hang_after)
    finally:
        display.close()
    trace = run.trace
    verdict = judge(trace, run.runs, target=spec.target, metric_names=spec.metric_names)
    meta: dict[str, Any] = {"command": " ".join(["squall", *sys.argv[1:]]), "shaping backend": trace.backend,
                            "duration_s": round(time.monotonic() - t0, 1),
                            "run": {"seconds": seconds, "hang_after": args.hang_after},
                            "provenance": provenance.finish(before),
                            "profiles": describe_profiles([(args.profile, args.workers)])}
    if spec.target is not None:
        meta["target"] = spec.target.to_mapping()
        meta["run"]["target"] = str(spec.target)
    results = Results(title=f"Squall run: {cid}", cells=(CellResult(cid, trace, (verdict,)),),
                      calibration=tuple(fidelity.rows), meta=meta)
    _, page = write_report(results, report_dir)
    if args.json:
        sys.stdout.write(json.dumps(result_json(trace, verdict, target=spec.target, report=str(page))) + "\n")
    else:
        sys.stdout.write(summary(cid, trace, verdict, spec.target, total_s=time.monotonic() - t0) + "\n")
        sys.stdout.write(f"report: {page}\n")
    return 0 if verdict.passed is True else 1


def _mb(n: int | None) -> str:
    return "-" if n is None else f"{n / 1e6:.2f} MB"


def summary(cid: str, trace: RunTrace, verdict: Verdict, target: Target | None, *, total_s: float) -> str:
    """The block ``squall run -- COMMAND`` ends with (``--json`` prints :func:`result_json` instead)."""
    res = result_json(trace, verdict, target=target)
    lines = [f"{cid}: {trace.workers} ranks, shaping backend {trace.backend}: {VERDICTS[verdict.passed].upper()}"]
    for r in res["ranks"]:
        again = f", restarted {r['restarts']}x" if r["restarts"] else ""
        lines.append(f"  rank {r['rank']}  {r['state']:<8} exit {r['exit_code']}{again}  sent "
                     f"{_mb(res['bytes_sent'][r['rank'] // res['nproc_per_node']])}  logs {r['logs']}")
    if target is not None:
        ttt = res["time_to_target_s"]
        lines.append(f"  time to target  {target.describe()}: " + ("not reached" if ttt is None else f"{ttt:.1f} s"))
    for name, points in res["metrics"].items():
        last: dict[int, float | str] = {}
        for p in points:
            last[p["rank"]] = p["value"]
        shown = ", ".join(str(v) if isinstance(v, str) else f"{v:.4g}" for _, v in sorted(last.items())) or "never read"
        lines.append(f"  {name:<15} last per rank: {shown}")
    lines.append(f"  bytes sent      {_mb(sum(res['bytes_sent']))} in all (kernel counters, IP bytes)")
    if res["nproc_per_node"] > 1:  # each rank's "sent" above is its node's
        for n in res["nodes"]:
            inside = "not read" if n["inside"] is None else _mb(n["inside"])
            lines.append(f"  node {n['node']} (ranks {', '.join(map(str, n['ranks']))}): sent {_mb(n['sent'])} to "
                         f"other nodes, {inside} inside (loopback)")
    for r in res["ranks"]:
        if r.get("blocked_in"):
            lines.append(f"  rank {r['rank']} blocked in {r['blocked_in']}  (stack: {r.get('stack_file') or '-'})")
    for fault in describe(trace.meta.faults):
        lines.append(f"  fault           {fault}")
    lines.append(f"  {verdict.line()}")
    lines.append(f"  ({total_s:.1f} s in all, {trace.meta.startup_s} s before the first figure)")
    return "\n".join(lines)


def cmd_image_requirements(args: argparse.Namespace) -> int:
    """``squall image build --requirements FILE`` / ``--pip PKG ...``: the derived image, built when missing."""
    from squall.cluster.engine import docker_client
    from squall.cluster.image import ensure_worker_image
    from squall.cluster.program_image import ensure_program_image
    from squall.programs.spec import requirement_lines

    lines, source = requirement_lines(args.requirements, args.pip or (), base=Path.cwd(), flag="--requirements")
    t0 = time.monotonic()
    client = docker_client()
    ensure_worker_image(client)
    tag = ensure_program_image(client, lines, source=source)
    out: Mapping[str, Any] = {"image": tag, "requirements": list(lines), "seconds": round(time.monotonic() - t0, 2)}
    sys.stdout.write((json.dumps(out) if args.json else f"program image: {tag} ({out['seconds']} s)") + "\n")
    return 0
