"""``squall calibrate``: measure what each link of a profile really does, against what it should do.

    squall calibrate --profile wan-5ms [--workers 4] [--backend nfqueue] [--engine swarm] [--json report.json]

Starts a cluster, shapes it with the profile, probes every directed link from inside the
containers (UDP echo for delay, jitter and loss; TCP transfers for rates), prints configured
against measured with a verdict per check, and tears everything down. Exit code 0 when every
check passed, 1 otherwise (failed, unknown, or host-limited unless ``--allow-host-limited``).
Progress (starting cluster, calibrating with the time so far, teardown) goes to stderr
(:mod:`squall.progress`).

Also runnable on its own: ``python -m squall.cli.calibrate calibrate --profile wan-5ms``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from squall.cluster.preflight import preflight
from squall.cluster.spec import ENGINES, default_engine, select_engine
from squall.profiles import Profile, ProfileError, load_profile
from squall.shaping.base import BACKENDS, ShapingError

if TYPE_CHECKING:
    from squall.calibration.segments import SegmentReport

logger = logging.getLogger(__name__)

DEFAULT_WORKERS = 4
#: The longest stretch of a changing profile ``squall calibrate`` judges segment by segment unless told
#: (``--over-time``): a trace of an hour is judged on its first two minutes.
OVER_TIME_CAP_S = 120.0
EXIT_PASSED = 0
EXIT_FAILED = 1
EXIT_USAGE = 2


def add_subparser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``calibrate`` on a parent command's sub-parsers."""
    parser = subparsers.add_parser(
        "calibrate", help="measure every link of a profile against its settings",
        description="Start a cluster, shape it with the profile, probe every directed link from inside the "
                    "containers and print configured against measured with a verdict per check. Exit 0 when "
                    "every check passed, 1 otherwise.")
    parser.add_argument("--profile", "-p", required=True, metavar="NAME_OR_FILE", help="the network profile")
    parser.add_argument("--workers", "-n", type=int, default=None,
                        help=f"cluster size (default {DEFAULT_WORKERS}, or the profile's minimum)")
    parser.add_argument("--backend", choices=BACKENDS, default=None,
                        help="shaping backend (default: netem if the kernel has it, else nfqueue)")
    parser.add_argument("--engine", choices=ENGINES, default=None,
                        help="where the probed containers run: this machine's Docker (local, the default) or a Docker "
                             "Swarm, probed and shaped through the node agents (swarm; see docs/swarm.md)")
    parser.add_argument("--json", metavar="PATH", type=Path, help="also write the report as JSON ('-': stdout)")
    parser.add_argument("--pairs", type=_pairs, default=None, metavar="A->B,...",
                        help="check only these directed links (default: all, sampled above 12)")
    parser.add_argument("--at", type=float, default=0.0, metavar="SECONDS", help="calibrate the links of this time")
    parser.add_argument("--quick", action="store_true", help="fewer packets for loss, shorter transfers")
    parser.add_argument("--over-time", type=float, default=None, metavar="SECONDS",
                        help="judge the profile over time only: each segment of its timeline (phases, trace "
                             "rows) in the first SECONDS, on link 0->1 (delay and loss per segment, rate on "
                             "segments of 2 s or more); segments too short to judge are listed. A profile whose "
                             f"links change is judged so by default too, after its first state, over its timeline "
                             f"up to {OVER_TIME_CAP_S:g} s")
    parser.add_argument("--allow-host-limited", action="store_true",
                        help="exit 0 even if some rates could not be verified because the host cannot carry them")
    parser.set_defaults(func=cmd_calibrate)


def _pairs(text: str) -> list[tuple[int, int]]:
    """argparse type: ``0->1,2->3``."""
    pairs = []
    for item in text.split(","):
        src, arrow, dst = item.partition("->")
        if not arrow or not src.strip().isdigit() or not dst.strip().isdigit():
            raise argparse.ArgumentTypeError(f"{item!r} is not a directed link such as 0->1")
        pairs.append((int(src), int(dst)))
    return pairs


def cmd_over_time(args: argparse.Namespace) -> int:
    """``squall calibrate --over-time SECONDS``: every segment of the timeline judged against its settings."""
    import json

    from squall.calibration.runner import calibration_spec
    from squall.calibration.segments import calibrate_segments, passed, summary_table
    from squall.calibration.stalls import HOST
    from squall.cluster.backend import open_cluster
    from squall.shaping import link_timeline

    try:
        profile = load_profile(args.profile)
        workers = args.workers or max(2, profile.required_workers())
        profile.runnable_for(workers, engine=args.engine or default_engine())
        select_engine(args.engine)
        preflight(args.backend, engine=args.engine)  # exit 3 with the reasons before anything starts
        with open_cluster(calibration_spec(workers)) as cluster:
            shaper = cluster.open_shaper(args.backend)
            try:
                report = calibrate_segments(cluster, shaper, link_timeline(profile, workers, args.over_time),
                                            args.over_time, policy=HOST)  # this run's stall policy
            finally:
                shaper.close()
    except ProfileError as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    except ShapingError as exc:
        logger.error("shaping failed: %s", exc)
        return EXIT_FAILED
    sys.stdout.write(f"{profile.name} over {args.over_time:g} s, link 0->1:\n{summary_table(report)}\n")
    for note in report.notes:
        sys.stdout.write(f"note: {note}\n")
    if args.json is not None:
        text = json.dumps(report.to_dict(), indent=1)
        if str(args.json) == "-":
            sys.stdout.write(text + "\n")
        else:
            args.json.write_text(text + "\n")
    return EXIT_PASSED if passed(report) else EXIT_FAILED


def changing_span(profile: Profile) -> float | None:
    """How long a changing profile's timeline is judged by default: one pass of its phases and traces, the
    last segment included (as long as the one before it, at least 5 s), capped at :data:`OVER_TIME_CAP_S`;
    None for a profile whose links hold still."""
    times = sorted(profile.change_times())
    if not times:
        return None
    last = times[-1] - times[-2] if len(times) > 1 else times[-1]
    return min(OVER_TIME_CAP_S, times[-1] + max(5.0, last))


def cmd_calibrate(args: argparse.Namespace) -> int:
    """``squall calibrate``."""
    if args.over_time is not None:
        if args.over_time <= 0:
            logger.error("--over-time must be a positive number of seconds, got %g", args.over_time)
            return EXIT_USAGE
        return cmd_over_time(args)
    from squall.calibration.runner import calibrate, calibration_spec
    from squall.calibration.stalls import HOST
    from squall.cluster.backend import open_cluster
    from squall.progress import Display

    if args.workers is not None and args.workers < 2:
        logger.error("--workers must be at least 2 (a link needs two ends), got %d", args.workers)
        return EXIT_USAGE
    try:
        profile = load_profile(args.profile)
        workers = args.workers or max(DEFAULT_WORKERS, profile.required_workers())
        profile.runnable_for(workers, engine=args.engine or default_engine())  # bad input before any cluster
        select_engine(args.engine)  # the engine of the cluster below (and of the spec's default)
        preflight(args.backend, engine=args.engine)  # exit 3 with the reasons before anything starts
        display = Display(label=f"calibrate {profile.name}")
        try:
            display.stage("starting cluster", f"{workers} workers")
            with display.logging_above(), open_cluster(calibration_spec(workers)) as cluster:
                expected = "quick: fewer packets, shorter transfers" if args.quick else \
                    "a full calibration of a shipped profile takes 30-60 s at 4 workers"
                with display.ticking("calibrating", expected=expected):
                    report = calibrate(profile, workers=workers, backend=args.backend, pairs=args.pairs,
                                       quick=args.quick, at=args.at, cluster=cluster, policy=HOST)
                span = changing_span(profile) if args.at == 0 else None
                segments = None
                if span is not None:
                    with display.ticking("judging every segment", expected=f"the first {span:g} s of the timeline"):
                        segments = _segments(cluster, args.backend, profile, workers, span)
                display.stage("teardown")
        finally:
            display.close()
    except ProfileError as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    except ShapingError as exc:
        logger.error("shaping failed: %s", exc)
        return EXIT_FAILED
    return _report(args, profile, report, segments, span)


def _report(args: argparse.Namespace, profile: Profile, report: Any, segments: SegmentReport | None,
            span: float | None) -> int:
    """Print (and write with ``--json``) the calibration and the segments' judgement; the exit code."""
    from squall.calibration.segments import passed, summary_table

    text = report.to_json()
    if segments is not None:
        text = json.dumps({**json.loads(text), "segments": segments.to_dict()})
    if args.json is not None and str(args.json) == "-":
        sys.stdout.write(text + "\n")
    else:
        sys.stdout.write(report.format() + "\n")
        if segments is not None and span is not None:
            sys.stdout.write(f"\n{profile.name}'s links change over time: the above is its first state; every segment "
                             f"of its first {span:g} s (one pass, at most {OVER_TIME_CAP_S:g} s; --over-time SECONDS "
                             f"to choose), link 0->1:\n{summary_table(segments)}\n")
            for note in segments.notes:
                sys.stdout.write(f"note: {note}\n")
        if args.json is not None:
            args.json.write_text(text + "\n")
    ok = report.passed(allow_host_limited=args.allow_host_limited) and (segments is None or passed(segments))
    return EXIT_PASSED if ok else EXIT_FAILED


def _segments(cluster: Any, backend: str | None, profile: Profile, workers: int, span: float) -> SegmentReport:
    """Every segment of ``profile``'s timeline over ``span`` seconds, judged on ``cluster`` with a fresh shaper."""
    from squall.calibration.segments import calibrate_segments
    from squall.calibration.stalls import HOST
    from squall.shaping import link_timeline

    shaper = cluster.open_shaper(backend)
    try:
        return calibrate_segments(cluster, shaper, link_timeline(profile, workers, span), span, policy=HOST)
    finally:
        shaper.close()


def main(argv: list[str] | None = None) -> int:
    """``python -m squall.cli.calibrate calibrate ...``."""
    parser = argparse.ArgumentParser(prog="squall", description=__doc__)
    add_subparser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(name)s %(message)s", stream=sys.stderr)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
