"""``squall run``, ``squall matrix``, ``squall report`` and ``squall claims``.

``run`` and ``matrix`` show live progress on stderr (:mod:`squall.progress`: a status line on a
terminal, plain lines in a CI log); ``run`` ends with a summary (steps, time to target, loss,
bytes sent, report path) and writes a report like ``matrix`` does.
"""

from __future__ import annotations

import argparse
import json
import logging
import shutil
import sys
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from squall.assets import find_matrix
from squall.checks import Validity, converged, merge, time_to_target
from squall.checks.liveness import run_verdicts
from squall.claims.registry import load_claims
from squall.cluster.preflight import preflight
from squall.cluster.spec import ENGINES, select_engine
from squall.experiment.comparison import matrix_plans
from squall.experiment.fidelity import SessionCalibration
from squall.experiment.lab import ExperimentError
from squall.experiment.matrix import build_matrix, load_matrix_file
from squall.experiment.runner import run_matrix
from squall.experiment.session import Session
from squall.programs.spec import ProgramError
from squall.progress import Display
from squall.protocols.catalog import PROTOCOLS
from squall.report import provenance
from squall.report.network import describe_profiles
from squall.report.page import CellResult, ClaimResult, Results, load_results, write_report
from squall.run_trace import RunTrace, trace_to_json
from squall.target import Target


def _cmd_replay(args: argparse.Namespace, *, every: bool) -> int:
    """``squall run --replay DIR`` (one recorded run: ``--cell``, else the only or first one) and
    ``squall matrix --replay DIR`` (every recorded run): the same profile, seeds and timeline."""
    from squall.experiment.replay import recorded_cells
    from squall.experiment.runner import run_replays

    select_engine(args.engine)
    cells = recorded_cells(args.replay)
    if not every:
        wanted = getattr(args, "cell", None)
        chosen = [c for c in cells if c.cell_id == wanted] if wanted else cells[:1]
        if not chosen:
            raise ValueError(f"--cell {wanted!r}: {args.replay} records {[c.cell_id for c in cells]}")
        cells = chosen
    preflight(args.backend, engine=args.engine)  # exit 3 with the reasons before anything starts
    display = Display()
    try:
        with display.logging_above():
            results = run_replays(cells, backend=args.backend, progress=display.line, observer=display,
                                  title=f"Squall replay of {args.replay}")
    finally:
        display.close()
    _, page = write_report(results, args.report)
    _summary(results.cells, (), {})
    sys.stdout.write(f"report: {page}\n")
    return matrix_exit_code(results.cells, (), {})


def check_hang_after(value: float | None) -> None:
    """``--hang-after`` must be a number of seconds > 0 (a usage error, exit 2, before anything starts)."""
    if value is not None and not value > 0:
        raise ValueError(f"--hang-after: a number of seconds > 0, got {value:g}")


def _cmd_run(args: argparse.Namespace) -> int:
    if args.replay is not None:
        return _cmd_replay(args, every=False)
    command = list(args.command or [])
    if command[:1] == ["--"]:
        command = command[1:]
    if not args.profile:
        raise ValueError("squall run needs --profile (or --replay RESULTS_DIR)")
    if bool(command) == bool(args.protocol):
        raise ValueError("give exactly one of --protocol NAME and a command after -- (squall run ... -- python "
                         "train.py)")
    check_hang_after(args.hang_after)
    if command:
        from squall.cli.program import cmd_run_program

        return cmd_run_program(args, command)
    program_only = [f for f, v in (("--metric", args.metric), ("--workdir", args.workdir),
                                   ("--requirements", args.requirements), ("--pip", args.pip), ("--name", args.name),
                                   ("--exclude", args.exclude), ("--nproc-per-node", args.nproc_per_node != 1))
                    if v]
    if program_only:
        raise ValueError(f"{', '.join(program_only)}: only for a command (squall run ... -- COMMAND)")
    if args.seconds is None:
        args.seconds = 20.0
    select_engine(args.engine)  # the default engine of every cluster this command starts
    matrix = build_matrix({"protocols": [args.protocol], "profiles": [args.profile], "workers": [args.workers]},
                          source="squall run", known_protocols=PROTOCOLS)
    run: dict[str, Any] = {"seconds": args.seconds, "task": args.task, "lr": args.lr, "hang_after": args.hang_after,
                           "agree": tuple(args.agree or ())}
    target = Target.parse(args.target) if args.target else None
    if target is not None:
        run["target"] = target.to_mapping()
    cell = matrix.cells()[0]
    from squall.experiment.lab import RunSpec

    spec = RunSpec(protocol=cell.protocol, profile=cell.profile, seed=args.seed, **run)  # a bad --agree: exit 2
    preflight(args.backend, engine=args.engine)  # exit 3 with the reasons before anything starts
    display = Display(label=cell.id())
    t0, before = time.monotonic(), provenance.collect()
    try:
        fidelity = SessionCalibration(enabled=args.calibrate, progress=display.line)
        with display.logging_above(), Session(backend=args.backend, observer=display, fidelity=fidelity) as labs:
            trace = labs.run(spec, cell.workers)
    except ExperimentError as exc:
        display.close()
        logging.getLogger("squall").error("%s: %s", cell.id(), exc)
        return 1
    finally:
        display.close()
    verdicts = (*run_verdicts(trace.meta), *((converged(trace, target),) if target else ()))
    verdict = verdicts[0] if verdicts else None
    run["agree"] = [str(a) for a in spec.agree]
    results = Results(title=f"Squall run: {cell.id()}", cells=(CellResult(cell.id(), trace, verdicts),),
                      calibration=tuple(fidelity.rows),
                      meta={"command": " ".join(["squall", *sys.argv[1:]]), "shaping backend": trace.backend,
                            "duration_s": round(time.monotonic() - t0, 1), "run": dict(run),
                            "provenance": provenance.finish(before),
                            "profiles": describe_profiles([(cell.profile, cell.workers)])})
    _, page = write_report(results, args.report)
    summary = run_summary(trace, target)
    if args.json:
        sys.stdout.write(json.dumps({"trace": trace_to_json(trace), "verdict": verdict and verdict.line(),
                                     "verdicts": [v.line() for v in verdicts], "hung": trace.meta.hang is not None,
                                     "faults": [f.to_json() for f in trace.meta.faults],
                                     "agreement": [a.to_json() for a in trace.meta.agreement],
                                     "summary": summary, "report": str(page)}) + "\n")
    else:
        sys.stdout.write(format_summary(cell.id(), trace, summary, total_s=time.monotonic() - t0) + "\n")
        for v in verdicts:
            sys.stdout.write(v.line() + "\n")
        sys.stdout.write(f"report: {page}\n")
    return 0 if merge(v.validity for v in verdicts) is Validity.PASS else 1


def run_summary(trace: RunTrace, target: Target | None) -> dict[str, Any]:
    """What ``squall run`` ends with: steps, time to target, losses, accuracy and bytes of one run."""
    last = {w: trace.of(w)[-1] for w in range(trace.workers) if trace.of(w)}
    losses = [r.loss for r in last.values() if r.loss is not None]
    evaluated = [r for r in trace.records if r.accuracy is not None or r.eval_loss is not None]
    final = evaluated[-1] if evaluated else None
    return {
        "workers": trace.workers,
        "backend": trace.backend,
        "steps_min": min((r.step for r in last.values()), default=0),
        "steps_max": max((r.step for r in last.values()), default=0),
        "training_s": round(trace.duration, 2),
        "target": target.describe() if target else None,
        "time_to_target_s": time_to_target(trace, target) if target else None,
        "final_loss": sum(losses) / len(losses) if losses else None,
        "final_eval_loss": final.eval_loss if final else None,
        "final_accuracy": final.accuracy if final else None,
        "bytes_sent": sum(r.bytes_sent for r in last.values()),
    }


def format_summary(cell_id: str, trace: RunTrace, s: Mapping[str, Any], *, total_s: float) -> str:
    """The summary block of ``squall run`` (see :func:`run_summary`)."""
    steps = f"{s['steps_max']}" if s["steps_min"] == s["steps_max"] else f"{s['steps_min']}-{s['steps_max']}"
    if s["target"] is None:
        ttt = "no target (--target accuracy=0.9)"
    elif s["time_to_target_s"] is None:
        ttt = f"{s['target']}: not reached"
    else:
        ttt = f"{s['target']}: {s['time_to_target_s']:.1f} s"
    per = s["bytes_sent"] / max(1, s["workers"])
    lines = [f"{cell_id}: {s['workers']} workers, shaping backend {s['backend']}",
             f"  steps           {steps} per worker in {s['training_s']:.1f} s of training ({total_s:.1f} s in all)",
             f"  time to target  {ttt}",
             "  final loss      " + (f"{s['final_loss']:.4g} (training, mean of the workers' last steps)"
                                     if s["final_loss"] is not None else "-")
             + (f"; eval loss {s['final_eval_loss']:.4g}" if s["final_eval_loss"] is not None else "")
             + (f"; accuracy {s['final_accuracy']:.3f}" if s["final_accuracy"] is not None else ""),
             f"  bytes sent      {s['bytes_sent'] / 1e6:.2f} MB in all, {per / 1e6:.2f} MB per worker"]
    return "\n".join(lines)


def _cmd_matrix(args: argparse.Namespace) -> int:
    if args.replay is not None:
        return _cmd_replay(args, every=True)
    if not args.file:
        raise ValueError("squall matrix needs a matrix file (or --replay RESULTS_DIR)")
    select_engine(args.engine)
    try:
        path = find_matrix(args.file)  # a path, or a shipped matrix by name (ci, stragglers, ...)
    except FileNotFoundError as exc:
        raise ValueError(str(exc)) from exc
    spec = load_matrix_file(path, known_protocols=PROTOCOLS)
    known = {c.id: c for c in load_claims()}
    unknown = [c for c in spec.claims if c not in known]
    if unknown:
        raise ValueError(f"{path}: claims: unknown claim ids {unknown}; known: {sorted(known)}")
    claims = [] if args.no_claims else [known[c] for c in spec.claims]
    staging = Path(tempfile.mkdtemp(prefix="squall-compare-"))
    display = Display()
    try:
        try:
            compares = matrix_plans(spec, where=str(path), base=path.resolve().parent, staging=staging)
        except ProgramError as exc:
            raise ValueError(str(exc)) from None
        preflight(args.backend, engine=args.engine)  # exit 3 with the reasons before anything starts
        with display.logging_above():
            results = run_matrix(spec.matrix, spec.run, claims=claims, backend=args.backend, progress=display.line,
                                 title=f"Squall matrix: {path.name}", observer=display,
                                 calibrate=spec.calibrate and not args.no_calibrate, logs=args.report / "ranks",
                                 snapshots=args.report / "snapshots", compares=compares)
    finally:
        display.close()
        shutil.rmtree(staging, ignore_errors=True)
    _, page = write_report(results, args.report)
    gates = {c.id: c.gate for c in claims}
    _summary(results.cells, results.claims, gates)
    sys.stdout.write(f"report: {page}\n")
    for c in results.comparisons:
        sys.stdout.write(f"compare {c['candidate']} against {c['baseline']}: "
                         f"{'REGRESSION' if c['regression'] else c['verdict']}\n")
    return matrix_exit_code(results.cells, results.claims, gates, results.comparisons)


def matrix_exit_code(cells: Sequence[CellResult], claims: Sequence[ClaimResult], gates: Mapping[str, bool],
                     comparisons: Sequence[Mapping[str, Any]] = ()) -> int:
    """0 when every cell's checks and every gating claim passed and no comparison found a regression; 1 otherwise.

    A claim with ``gate: false`` is measured and reported (its verdict is in the summary and the
    report) but does not fail the run: the registry says why it cannot gate.
    """
    gating = [v for c in cells for v in c.verdicts] + [c.verdict for c in claims if gates.get(c.claim_id, True)]
    regression = any(c.get("regression") for c in comparisons)
    return 0 if merge(v.validity for v in gating) is Validity.PASS and not regression else 1


def _summary(cells: Sequence[CellResult], claims: Sequence[ClaimResult], gates: Mapping[str, bool]) -> None:
    width = max([len(c.cell_id) for c in cells] + [4])
    for c in cells:
        validity = merge(v.validity for v in c.verdicts)
        state = "pass" if validity is Validity.PASS else validity.value.upper()
        sys.stdout.write(f"{c.cell_id:<{width}}  {state:<7}  {c.trace.duration:6.1f} s  "
                         + "; ".join(f"{v.check}={v.measured}" for v in c.verdicts) + "\n")
    for claim in claims:
        reported = "" if gates.get(claim.claim_id, True) else " (reported, not a gate)"
        sys.stdout.write(f"claim {claim.claim_id}{reported}: {claim.verdict.line()}\n")


def _cmd_report(args: argparse.Namespace) -> int:
    try:
        results = load_results(args.dir)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise ValueError(f"{args.dir}: not a results directory written by 'squall matrix' "
                         f"({type(exc).__name__}: {exc})") from None
    _, page = write_report(results, args.dir)
    sys.stdout.write(f"report: {page}\n")
    return 0


def _cmd_claims(args: argparse.Namespace) -> int:
    claims = load_claims()
    if args.json:
        sys.stdout.write(json.dumps([{"id": c.id, "paper": c.paper, "claim": c.claim, "paper_figure": c.paper_figure,
                                      "our_setting": c.our_setting} for c in claims]) + "\n")
    else:
        for c in claims:
            sys.stdout.write(f"{c.id}\n  {c.paper}: {c.claim}\n  paper: {c.paper_figure}\n  ours: {c.our_setting}\n")
    return 0


def add_subparser(sub: Any) -> None:
    """Register run, matrix, report and claims."""
    run = sub.add_parser("run", help="run one protocol, or your own command (-- COMMAND), on one profile and check it",
                         description="Run one protocol (--protocol) or your own program (everything after --, one "
                                     "rank per worker, with torchrun's environment) on a shaped cluster.")
    run.add_argument("--protocol", help="protocol name (squall protocols) or package.module:function")
    run.add_argument("--profile", help="profile name or YAML path")
    run.add_argument("--replay", type=Path, metavar="RESULTS_DIR",
                     help="run a recorded run again: its protocol, profile, seed, settings and realised timeline "
                          "(link changes and churn at their recorded times)")
    run.add_argument("--cell", help="with --replay: which recorded run (default: the first)")
    run.add_argument("--workers", type=int, default=4)
    run.add_argument("--nproc-per-node", type=int, default=1, metavar="K",
                     help="a command: K ranks in each worker container, as torchrun's --nproc-per-node (RANK = "
                          "node * K + local; the ranks of one container talk over its loopback, unshaped)")
    run.add_argument("--seed", type=int, default=0)
    run.add_argument("--seconds", type=float, default=None,
                     help="time budget: a protocol's training (default 20), a command's hard budget (default 60)")
    run.add_argument("--task", default="logreg_digits")
    run.add_argument("--lr", type=float, default=0.5)
    run.add_argument("--target", help="a protocol: stop and check at e.g. accuracy=0.9; a command: e.g. 'loss<=1.2' "
                                      "or 'accuracy>=0.9' on one of its metrics")
    run.add_argument("--metric", action="append", metavar="NAME=REGEX",
                     help="a command's figure read from each rank's stdout: the regex's first group (or group "
                          "'value'; group 'step' optional); repeatable")
    run.add_argument("--workdir", help="a command's folder, mounted read-only as its current directory "
                                       "(default: this directory)")
    run.add_argument("--requirements", metavar="FILE",
                     help="pip requirements of a command: installed in a derived worker image, built when missing")
    run.add_argument("--pip", nargs="+", metavar="PKG",
                     help="pip requirement specifiers of a command (as --requirements)")
    run.add_argument("--name", help="a command's name in the report (default: its script's name)")
    run.add_argument("--exclude", action="append", metavar="PATTERN",
                     help="a command's folder is copied for the containers (a read-only snapshot kept with the "
                          "report); leave out files matching this glob (repeatable; .git, caches and virtualenvs "
                          "are always left out)")
    run.add_argument("--hang-after", type=float, metavar="S",
                     help="stop the run as hung when no rank printed a line and the links carried under 1 KB/s for S "
                          "seconds, every rank's Python stack taken first with py-spy (default: 120, or the budget "
                          "when shorter)")
    run.add_argument("--agree", action="append", metavar="NAME[~TOL]",
                     help="every rank that finished must end with the same value of figure NAME (text, or a number "
                          "within the relative tolerance TOL); a command's --metric name, a protocol's record field "
                          "(loss, eval_loss, accuracy, norm, param_hash), or log:NAME for a figure only its records "
                          "write; repeatable")
    run.add_argument("--backend", choices=["netem", "nfqueue"])
    run.add_argument("--engine", choices=ENGINES, help="where the workers run: this machine's Docker (local, the "
                     "default) or a Docker Swarm with a node agent on every node (swarm; see docs/swarm.md)")
    run.add_argument("--json", action="store_true")
    run.add_argument("--calibrate", action="store_true",
                     help="calibrate the profile's links quickly before training (the report then says how faithful "
                          "the emulation was)")
    run.add_argument("--report", type=Path, default=Path("results/run"), help="report directory")
    run.add_argument("command", nargs=argparse.REMAINDER,
                     help="-- COMMAND [ARGS...]: run your own program instead of a protocol, one rank per worker")
    run.set_defaults(func=_cmd_run)

    matrix = sub.add_parser("matrix", help="run a matrix file (cells and claims) and write the report")
    matrix.add_argument("file", nargs="?",
                        help="matrix YAML, or a shipped matrix by name (ci, stragglers, compression, ...)")
    matrix.add_argument("--replay", type=Path, metavar="RESULTS_DIR",
                        help="run every recorded run of RESULTS_DIR again on its recorded timeline")
    matrix.add_argument("--report", type=Path, default=Path("results/matrix"), help="report directory")
    matrix.add_argument("--backend", choices=["netem", "nfqueue"])
    matrix.add_argument("--engine", choices=ENGINES, help="local (default) or swarm, as for squall run")
    matrix.add_argument("--no-claims", action="store_true", help="skip the claims listed in the file")
    matrix.add_argument("--no-calibrate", action="store_true",
                        help="do not calibrate each profile before its first cell (the matrix key calibrate: false "
                             "does the same)")
    matrix.set_defaults(func=_cmd_matrix)

    report = sub.add_parser("report", help="rebuild report.md and report.html from a results directory")
    report.add_argument("dir", type=Path)
    report.set_defaults(func=_cmd_report)

    claims = sub.add_parser("claims", help="list the claims registry")
    claims.add_argument("--json", action="store_true")
    claims.set_defaults(func=_cmd_claims)

