"""``squall compare``: did my change help, on which networks, and how sure are we?

Three forms, each a baseline against a candidate:

* two commands: ``--baseline 'python train.py' --candidate 'python train.py --hook powersgd'``;
* the folder's own history: ``--ref origin/main -- python train.py`` (the baseline is the folder as
  committed at the ref, the candidate the folder as it is now, uncommitted changes included);
* two protocols, or one with different options: ``--baseline-protocol topk --candidate-protocol
  'topk k=0.05'`` (``NAME [KEY=VALUE ...]``, each value a YAML scalar, the keys the protocol's config
  as under a matrix's ``run: config:``).

Everything is checked before any container starts. Exit codes: 0 no gating measure is worse; 1 one
is (a regression); 2 bad usage; 3 the environment is not ready.
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from squall.checks.measures import BYTES_SENT, BYTES_TO_TARGET, FINAL, STEP_INTERVAL, TIME_TO_TARGET
from squall.cluster.preflight import preflight
from squall.cluster.spec import ENGINES, MAX_WORKERS, default_engine, select_engine
from squall.experiment.comparison import (
    DEFAULT_RUNS,
    DEFAULT_TOLERANCE,
    ComparePlan,
    CompareResult,
    ProfileResult,
    Side,
    fraction,
    protocol_words,
    run_comparison,
)
from squall.experiment.fidelity import SessionCalibration
from squall.experiment.lab import RunSpec
from squall.experiment.program import program_image
from squall.experiment.session import Session
from squall.profiles import load_profile
from squall.programs.snapshot import resolve_ref, snapshot_ref
from squall.programs.spec import ProgramError, ProgramSpec, program_from_args
from squall.progress import Display
from squall.report import provenance
from squall.report.comparison import write_comparison
from squall.target import Target

MEASURES = (TIME_TO_TARGET, BYTES_TO_TARGET, BYTES_SENT, STEP_INTERVAL)
DEFAULT_SECONDS = {"program": 60.0, "protocol": 20.0}


def tolerance(text: str) -> float:
    """``2%`` or ``0.02`` -> 0.02."""
    try:
        return fraction(text, where="--tolerance")
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def protocol_side(text: str, *, flag: str) -> tuple[str, dict[str, Any]]:
    """``NAME [KEY=VALUE ...]`` -> the protocol and its config (values read as YAML scalars)."""
    return protocol_words(text, where=flag)


def _command(text: str, *, flag: str) -> list[str]:
    try:
        words = shlex.split(text)
    except ValueError as exc:
        raise ValueError(f"{flag}: {text!r} is not a command line: {exc}") from None
    if not words:
        raise ValueError(f"{flag}: give a command, e.g. 'python train.py'")
    return words


def _program(args: argparse.Namespace, argv: Sequence[str], *, name: str, workdir: str | None = None) -> ProgramSpec:
    return program_from_args(argv, metrics=args.metric or (), target=args.target, workdir=workdir or args.workdir,
                             requirements=args.requirements, pip=args.pip or (), name=name,
                             exclude=args.exclude or (), nproc_per_node=args.nproc_per_node)


def build_sides(args: argparse.Namespace, command: Sequence[str], staging: Path) -> tuple[Side, Side, str]:
    """The two sides and their kind (program or protocol), from exactly one of the three forms."""
    forms = {"--baseline/--candidate": bool(args.baseline or args.candidate), "--ref": bool(args.ref),
             "--baseline-protocol/--candidate-protocol": bool(args.baseline_protocol or args.candidate_protocol)}
    chosen = [f for f, given in forms.items() if given]
    if len(chosen) != 1:
        raise ValueError(f"give exactly one of {', '.join(forms)} (got {', '.join(chosen) or 'none'})")
    form = chosen[0]
    if form != "--ref" and command:
        raise ValueError(f"a command after -- goes with --ref; with {form} each side is its own flag")
    if form == "--baseline/--candidate":
        if not (args.baseline and args.candidate):
            raise ValueError("give both --baseline 'COMMAND' and --candidate 'COMMAND'")
        base = _program(args, _command(args.baseline, flag="--baseline"), name="baseline")
        cand = _program(args, _command(args.candidate, flag="--candidate"), name="candidate")
        return Side("baseline", args.baseline, program=base), Side("candidate", args.candidate, program=cand), \
            "program"
    if form == "--ref":
        if not command:
            raise ValueError("--ref REF needs the command after --: squall compare --ref origin/main ... -- python "
                             "train.py")
        cand = _program(args, command, name="candidate")
        ref = resolve_ref(args.ref, cand.workdir)
        snap = snapshot_ref(ref, staging / "baseline-ref", excludes=cand.excludes)
        base = _program(args, command, name="baseline", workdir=snap.path)
        line = shlex.join(command)
        return (Side("baseline", f"{line} at {snap.source}", program=base),
                Side("candidate", f"{line} in {cand.workdir} as it is now", program=cand), "program")
    if not (args.baseline_protocol and args.candidate_protocol):
        raise ValueError("give both --baseline-protocol and --candidate-protocol")
    program_only = [f for f, v in (("--metric", args.metric), ("--workdir", args.workdir),
                                   ("--requirements", args.requirements), ("--pip", args.pip),
                                   ("--exclude", args.exclude), ("--nproc-per-node", args.nproc_per_node != 1))
                    if v]
    if program_only:
        raise ValueError(f"{', '.join(program_only)}: only for commands, not protocols")
    sides = []
    for name, text in (("baseline", args.baseline_protocol), ("candidate", args.candidate_protocol)):
        protocol, config = protocol_side(text, flag=f"--{name}-protocol")
        spec = RunSpec(protocol=protocol, profile=args.profile[0], task=args.task, lr=args.lr, config=config)
        sides.append(Side(name, text, protocol=spec))
    return sides[0], sides[1], "protocol"


def _plan(args: argparse.Namespace, base: Side, cand: Side, kind: str) -> ComparePlan:
    engine = args.engine or default_engine()
    for name in args.profile:  # a bad profile or size: usage, before anything starts
        profile = load_profile(name)
        if not profile.required_workers() <= args.workers <= MAX_WORKERS[engine]:
            raise ValueError(f"--workers: profile {profile.name!r} needs {profile.required_workers()}.."
                             f"{MAX_WORKERS[engine]} workers on the {engine} engine, got {args.workers}")
        profile.runnable_for(args.workers, engine=engine)
    target = None
    if args.target:
        target = base.program.target if base.program is not None else Target.parse(args.target)
    for gate in args.gate or ():
        if gate not in MEASURES and not gate.startswith(FINAL):
            raise ValueError(f"--gate {gate!r}: allowed: {', '.join(MEASURES)} or final_<figure> (e.g. final_loss)")
        if gate in (TIME_TO_TARGET, BYTES_TO_TARGET) and target is None:
            raise ValueError(f"--gate {gate}: needs --target")
    seconds = args.seconds if args.seconds is not None else DEFAULT_SECONDS[kind]
    return ComparePlan(baseline=base, candidate=cand, profiles=tuple(args.profile), workers=args.workers,
                       runs=args.runs, max_runs=args.max_runs, seconds=seconds, seed=args.seed, target=target,
                       figures=tuple(args.figure or ()), tolerance=args.tolerance, gate=tuple(args.gate or ()))


def cmd_compare(args: argparse.Namespace) -> int:
    command = list(args.command or [])
    if command[:1] == ["--"]:
        command = command[1:]
    if not args.profile:
        raise ValueError("squall compare needs at least one --profile")
    select_engine(args.engine)
    report: Path = args.report
    staging = Path(tempfile.mkdtemp(prefix="squall-compare-"))
    try:
        try:
            base, cand, kind = build_sides(args, command, staging)
        except ProgramError as exc:
            raise ValueError(str(exc)) from None
        plan = _plan(args, base, cand, kind)
        preflight(args.backend, engine=args.engine)  # exit 3 with the reasons before anything starts
        if base.program is not None:
            program_image(base.program)  # a requirement that cannot be installed: before any container
        return _run(args, plan, report)
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _run(args: argparse.Namespace, plan: ComparePlan, report: Path) -> int:
    display = Display(label="compare")
    t0, before = time.monotonic(), provenance.collect()
    fidelity = SessionCalibration(enabled=args.calibrate, progress=display.line)
    try:
        with display.logging_above(), Session(backend=args.backend, observer=display, fidelity=fidelity,
                                              snapshots=report / "snapshots") as session:
            profiles = run_comparison(plan, session, logs=report / "ranks", progress=display.line)
            backends = session.backends()
    finally:
        display.close()
    meta = {"command": shlex.join(["squall", *sys.argv[1:]]), "shaping backend": ", ".join(backends),
            "duration_s": round(time.monotonic() - t0, 1), "provenance": provenance.finish(before),
            "calibration": list(fidelity.verdicts.items())}
    result = CompareResult(plan, profiles, meta)
    page = write_comparison(result.to_json(), {(p.profile, r.side, r.pair): r.trace for p in profiles for r in p.runs
                                               if r.trace is not None}, report)
    if args.json:
        sys.stdout.write(json.dumps({**result.to_json(), "report": str(page)}) + "\n")
    else:
        sys.stdout.write(format_result(result) + f"\nreport: {page}\n")
    return 1 if result.regression else 0


def _median(values: Sequence[float | None]) -> str:
    known = [v for v in values if v is not None]
    return "-" if not known else f"{statistics.median(known):.4g}"


def format_profile(profile: ProfileResult) -> list[str]:
    """One table per profile: measure, medians, ratio with its interval, verdict."""
    rows = [("measure", "baseline", "candidate", "ratio [95% CI]", "verdict")]
    for m in profile.measures:
        c = m.comparison
        ratio = "-" if c.ratio is None else f"{c.ratio:.3f} [{c.ci_low:.3f}, {c.ci_high:.3f}]" \
            if c.ci_low is not None and c.ci_high is not None else f"{c.ratio:.3f}"
        censored = sum(m.candidate.censored) + sum(m.baseline.censored)
        rows.append((m.name + ("*" if m.gating else "") + (f" ({censored} censored)" if censored else ""),
                     _median(m.baseline.values),
                     _median(m.candidate.values), ratio, "~ same" if c.verdict == "same" else c.verdict))
    widths = [max(len(r[k]) for r in rows) for k in range(5)]
    pairs = len(profile.runs) // 2
    head = f"{profile.profile}: {pairs} pairs" + (" (decided early)" if profile.stopped_early else "") \
        + " (* gating: decides the exit code)"
    return [head] + ["  " + "  ".join(cell.ljust(w) for cell, w in zip(r, widths, strict=True)) for r in rows]


def format_result(result: CompareResult) -> str:
    """What ``squall compare`` prints without ``--json``."""
    lines = [f"baseline:  {result.plan.baseline.label}", f"candidate: {result.plan.candidate.label}", ""]
    for profile in result.profiles:
        lines += [*format_profile(profile), ""]
    word = "REGRESSION" if result.regression else result.verdict
    gates = sorted({m.name for m in result.gating()})
    lines.append(f"verdict: {word} (gating: {', '.join(gates) or 'none'}, {result.plan.confidence:.0%} together; "
                 f"tolerance {result.plan.tolerance:.1%})")
    return "\n".join(lines)


def add_subparser(sub: Any) -> None:
    """Register ``squall compare``."""
    p = sub.add_parser(
        "compare", help="a baseline against a candidate, repeated and interleaved, with confidence intervals",
        description="Run a baseline and a candidate in interleaved pairs on the same containers on every profile, "
                    "and say per measure whether the candidate is better, worse, the same (no detectable "
                    "difference) or unknown, with the ratio candidate/baseline and its 95%% confidence interval. "
                    "Exit 1 when a gating measure is worse (a regression).")
    p.add_argument("--baseline", metavar="COMMAND", help="the baseline's command line, split as a shell would")
    p.add_argument("--candidate", metavar="COMMAND", help="the candidate's command line")
    p.add_argument("--ref", help="the baseline is the folder as committed at this git ref (e.g. origin/main), the "
                                 "candidate the folder as it is now; the command follows --")
    p.add_argument("--baseline-protocol", metavar="'NAME [KEY=VALUE ...]'", help="a protocol and its options")
    p.add_argument("--candidate-protocol", metavar="'NAME [KEY=VALUE ...]'", help="a protocol and its options")
    p.add_argument("--profile", action="append", help="a network profile (repeatable: each is compared on its own)")
    p.add_argument("--workers", type=int, default=4)
    p.add_argument("--nproc-per-node", type=int, default=1, metavar="K",
                   help="commands: K ranks in each worker container, as torchrun's --nproc-per-node")
    p.add_argument("--runs", type=int, default=DEFAULT_RUNS, help=f"runs per side per profile (default {DEFAULT_RUNS})")
    p.add_argument("--max-runs", type=int, help="keep adding pairs past --runs, up to this many, until every gating "
                                                "measure is decided (default twice --runs; --runs: exactly --runs)")
    p.add_argument("--seconds", type=float, help="each run's budget (default 60 for a command, 20 for a protocol)")
    p.add_argument("--seed", type=int, default=0, help="pair k runs with seed + k on both sides (SQUALL_SEED)")
    p.add_argument("--metric", action="append", metavar="NAME=REGEX", help="a command's figure read from stdout, "
                                                                           "as for squall run")
    p.add_argument("--target", help="e.g. 'loss<=1.2': time and bytes to it are compared")
    p.add_argument("--figure", action="append", metavar="NAME",
                   help="compare the final value of this figure (repeatable; default: every figure the runs report)")
    p.add_argument("--tolerance", type=tolerance, default=DEFAULT_TOLERANCE, metavar="PCT",
                   help="a change smaller than this (e.g. 2%%) is neither worse nor better (default 1%%: a byte count "
                        "that moves by a few packets is no change)")
    p.add_argument("--gate", action="append", metavar="MEASURE",
                   help="the measures that decide the exit code (repeatable; default: time_to_target_s with a "
                        "--target, else every measure); together they hold the 95%% confidence")
    p.add_argument("--workdir", help="the commands' folder (default: this directory); copied for the containers")
    p.add_argument("--exclude", action="append", metavar="PATTERN", help="leave these files out of the folder's copy")
    p.add_argument("--requirements", metavar="FILE", help="pip requirements of the commands (a derived image)")
    p.add_argument("--pip", nargs="+", metavar="PKG", help="pip requirement specifiers of the commands")
    p.add_argument("--task", default="logreg_digits", help="a protocol's task")
    p.add_argument("--lr", type=float, default=0.5, help="a protocol's learning rate")
    p.add_argument("--backend", choices=["netem", "nfqueue"])
    p.add_argument("--engine", choices=ENGINES, help="local (default) or swarm, as for squall run")
    p.add_argument("--calibrate", action="store_true", help="calibrate each profile quickly before its first run")
    p.add_argument("--json", action="store_true", help="print one JSON object (regression, verdict, profiles)")
    p.add_argument("--report", type=Path, default=Path("results/compare"), help="report directory")
    p.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND [ARGS...]: the command, with --ref")
    p.set_defaults(func=cmd_compare)
