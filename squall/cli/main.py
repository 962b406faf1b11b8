"""The ``squall`` command.

Exit codes: 0 success; 1 the thing ran and failed (a job, a check, a validation); 2 bad usage or
input; 3 the environment is not ready (no Docker engine, no image); 128 + the signal's number when
stopped by a signal sent to the main process, after cancelling the jobs and tearing everything down:
129 SIGHUP, 130 SIGINT (Ctrl-C), 143 SIGTERM (``kill``, a CI runner's cancel); 141 when the reader
of the output went away (SIGPIPE, ``squall ... | head``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import signal
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
EXIT_ENVIRONMENT = 3
EXIT_BROKEN_PIPE = 128 + 13  # what a shell reports for a command killed by SIGPIPE (`squall ... | head`)
MAX_WORKERS = 250  # containers in one cluster (ClusterSpec's bound)
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)

logger = logging.getLogger("squall")


class Interrupted(KeyboardInterrupt):
    """A stop signal reached the main process: unwinds every ``with`` block (jobs cancelled, clusters
    and shaping torn down) like Ctrl-C does; :func:`main` exits with 128 + the signal's number."""

    def __init__(self, signum: int) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum
        self.at = time.monotonic()


def _stop_on(signum: int, _frame: FrameType | None) -> None:
    """Handler of SIGINT/SIGTERM/SIGHUP: say so at once, then unwind (a second signal while
    unwinding is only reported: the teardown in progress finishes; 'squall gc' is for what it cannot)."""
    name = signal.Signals(signum).name
    erase = "\r\x1b[K" if _isatty(sys.stderr) else ""
    if _stopping:
        _say(f"{erase}squall: {name} again: teardown is under way, please wait\n")
        return
    _stopping.append(signum)
    _say(f"{erase}squall: {name} received: cancelling the jobs and tearing down\n")
    raise Interrupted(signum)


_stopping: list[int] = []  # signals received so far in this process


def _isatty(stream: Any) -> bool:
    try:
        return bool(stream.isatty())
    except (AttributeError, ValueError):
        return False


def _say(text: str) -> None:
    """Write to stderr from a signal handler: straight to the file descriptor, no buffer to share."""
    with contextlib.suppress(OSError, ValueError, AttributeError):
        os.write(sys.stderr.fileno(), text.encode())


def install_stop_handlers() -> dict[int, Any]:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Interrupted` in the main thread.

    SIGINT too, explicitly: a process started in the background by a non-interactive shell
    inherits SIGINT ignored, and Python then leaves it ignored (a CI runner's Ctrl-C did nothing).
    """
    _stopping.clear()
    return {sig: signal.signal(sig, _stop_on) for sig in STOP_SIGNALS}


def _out(text: str = "") -> None:
    sys.stdout.write(text + "\n")


# -- image ---------------------------------------------------------------------------------------
def _cmd_image_build(args: argparse.Namespace) -> int:
    from squall.cluster.engine import docker_client
    from squall.cluster.image import ensure_worker_image

    if args.requirements or args.pip:
        from squall.cli.program import cmd_image_requirements

        return cmd_image_requirements(args)
    t0 = time.monotonic()
    tag = ensure_worker_image(docker_client(), pull=args.pull)
    if args.json:
        _out(json.dumps({"image": tag, "seconds": round(time.monotonic() - t0, 2)}))
    else:
        _out(f"worker image: {tag} ({time.monotonic() - t0:.1f} s)")
    return EXIT_OK


def _cmd_image_status(args: argparse.Namespace) -> int:
    from squall.cluster.engine import docker_client
    from squall.cluster.image import current_worker_tag

    tag = current_worker_tag(docker_client())
    if args.json:
        _out(json.dumps({"image": tag, "built": tag is not None}))
    else:
        _out(f"worker image: {tag}" if tag else "worker image: not built for the current inputs ('squall image build')")
    return EXIT_OK if tag else EXIT_ENVIRONMENT  # an image not built is an environment not ready


def _cmd_image_prune(args: argparse.Namespace) -> int:
    from squall.cluster.engine import docker_client
    from squall.cluster.image_prune import prune_images

    removed, errors = prune_images(docker_client(), dry_run=args.dry_run)
    if args.json:
        _out(json.dumps({"removed": removed, "errors": errors}))
    else:
        verb = "would remove" if args.dry_run else "removed"
        _out(f"{verb} {len(removed)} stale image(s)" + "".join(f"\n  {t}" for t in removed))
        for err in errors:
            _out(f"  error: {err}")
    return EXIT_FAILED if errors else EXIT_OK


# -- gc ------------------------------------------------------------------------------------------
def _cmd_gc(args: argparse.Namespace) -> int:
    from squall.cluster.engine import docker_client
    from squall.cluster.gc import collect

    report = collect(docker_client(), everything=args.all, dry_run=args.dry_run)
    if args.json:
        _out(json.dumps(report.__dict__))
    else:
        verb = "would remove" if args.dry_run else "removed"
        live = sorted(r for r, alive in report.runs.items() if alive and not args.all)
        _out(f"{verb} {len(report.removed_containers)} container(s), {len(report.removed_networks)} network(s), "
             f"{len(report.removed_dirs)} state dir(s), {len(report.stopped_daemons)} nfqueue daemon(s), "
             f"{len(report.removed_workdirs)} nfqueue work dir(s); {len(live)} live run(s) kept")
        for err in report.errors:
            _out(f"  error: {err}")
    return EXIT_FAILED if report.errors else EXIT_OK


# -- cluster -------------------------------------------------------------------------------------
def _cmd_cluster_run(args: argparse.Namespace) -> int:
    from squall.cluster import Cluster, ClusterSpec

    config = json.loads(args.config) if args.config else {}
    spec = ClusterSpec(workers=args.workers, cpus=args.cpus, memory=args.memory)
    with Cluster(spec) as cluster:
        results = cluster.run_job(args.entry, config, timeout=args.timeout, raise_on_failure=False)
    rows = [{"node": r.node, "state": r.state, "exit_code": r.exit_code, "duration_s": r.duration_s,
             "value": r.value} for r in results]
    if args.json:
        _out(json.dumps(rows))
    else:
        for row in rows:
            _out(f"node {row['node']}: {row['state']} exit={row['exit_code']} value={row['value']}")
    return EXIT_OK if all(r.ok for r in results) else EXIT_FAILED


def _cmd_demo(args: argparse.Namespace) -> int:
    from squall.cli.demo import run_demo

    if not 2 <= args.workers <= MAX_WORKERS:
        raise ValueError(f"--workers must be an integer in 2..{MAX_WORKERS}, got {args.workers}")
    return run_demo(workers=args.workers, as_json=args.json)


# -- wiring --------------------------------------------------------------------------------------
def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``squall``."""
    parser = argparse.ArgumentParser(prog="squall", description="Distributed-training protocols on bad networks.")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="more logging (-vv for debug)")
    sub = parser.add_subparsers(dest="command", required=True)

    image = sub.add_parser("image", help="the worker image").add_subparsers(dest="image_command", required=True)
    build = image.add_parser("build", help="build the worker image if its inputs changed")
    build.add_argument("--pull", action=argparse.BooleanOptionalAction, default=None,
                       help="--pull: the base must be python:3.11-slim from a registry; --no-pull: never ask a "
                            "registry (debootstrap from SQUALL_DEBIAN_MIRROR); default: pull when no base is "
                            "present and the registry answers, else debootstrap")
    build.add_argument("--requirements", metavar="FILE",
                       help="build the image for a program with these pip requirements (as squall run --requirements)")
    build.add_argument("--pip", nargs="+", metavar="PKG", help="requirement specifiers, as --requirements")
    build.add_argument("--json", action="store_true")
    build.set_defaults(func=_cmd_image_build)
    status = image.add_parser("status", help="is the worker image built for the current inputs?")
    status.add_argument("--json", action="store_true")
    status.set_defaults(func=_cmd_image_status)

    prune = image.add_parser("prune", help="remove squall images built for inputs that are no longer current")
    prune.add_argument("--dry-run", action="store_true")
    prune.add_argument("--json", action="store_true")
    prune.set_defaults(func=_cmd_image_prune)

    gc = sub.add_parser("gc", help="remove containers, networks and files of runs that are gone")
    gc.add_argument("--all", action="store_true", help="also remove runs whose owner is still alive")
    gc.add_argument("--dry-run", action="store_true", help="only say what would be removed")
    gc.add_argument("--json", action="store_true")
    gc.set_defaults(func=_cmd_gc)

    cluster = sub.add_parser("cluster", help="start a cluster, run one job on every node, tear down")
    cluster.add_argument("entry", help="job entry point: a registry name (noop, echo_mesh, ...) or module:function")
    cluster.add_argument("--workers", type=int, default=4)
    cluster.add_argument("--cpus", type=float, default=1.0)
    cluster.add_argument("--memory", default="1g")
    cluster.add_argument("--config", help="the job's config as a JSON object")
    cluster.add_argument("--timeout", type=float, default=120.0)
    cluster.add_argument("--json", action="store_true")
    cluster.set_defaults(func=_cmd_cluster_run)

    demo = sub.add_parser("demo", help="the default experiment on a small cluster")
    demo.add_argument("--workers", type=int, default=4)
    demo.add_argument("--json", action="store_true")
    demo.set_defaults(func=_cmd_demo)

    for extension in _extensions():
        extension(sub)
    return parser


def _extensions() -> list[Callable[[Any], None]]:
    """Sub-commands that live in their own modules."""
    from squall.cli.calibrate import add_subparser as calibrate
    from squall.cli.compare import add_subparser as compare
    from squall.cli.doctor import add_subparser as doctor
    from squall.cli.kube import add_subparser as kube
    from squall.cli.profiles import add_subparser as profiles
    from squall.cli.protocols import add_subparser as protocols
    from squall.cli.run import add_subparser as run

    return [profiles, calibrate, run, compare, protocols, doctor, kube]


def main(argv: list[str] | None = None) -> int:
    """Entry point of ``squall``: the command's exit code (see the module docstring).

    A reader that goes away (``squall profiles list | head``) ends the command quietly, the way a
    tool killed by SIGPIPE does, instead of with a BrokenPipeError traceback.
    """
    try:
        return _main(argv)
    except BrokenPipeError:
        # Python's documented recipe: point stdout at devnull so the flush at exit cannot fail again.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return EXIT_BROKEN_PIPE


def _main(argv: list[str] | None) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if threading.current_thread() is not threading.main_thread():
        return _run(args)
    previous = install_stop_handlers()
    try:
        return _run(args)
    finally:  # main() called in process (tests): leave the caller's handlers as they were
        for sig, handler in previous.items():
            signal.signal(sig, handler)


def _run(args: argparse.Namespace) -> int:
    level = logging.WARNING - 10 * min(args.verbose, 2) if args.verbose else logging.INFO
    logging.basicConfig(level=level, format="%(asctime)s %(name)s %(levelname)s %(message)s", stream=sys.stderr)
    from squall.assets import AssetError
    from squall.cluster.errors import ClusterError, ClusterSpecError, EngineUnavailable, ImageError
    from squall.cluster.preflight import NotReady

    try:
        code: int = args.func(args)
    except (EngineUnavailable, ImageError, AssetError, NotReady) as exc:
        logger.error("%s", exc)
        return EXIT_ENVIRONMENT
    except (ClusterSpecError, ValueError) as exc:
        logger.error("%s", exc)
        return EXIT_USAGE
    except ClusterError as exc:
        logger.error("%s", exc)
        return EXIT_FAILED
    except Interrupted as exc:
        _say(f"squall: stopped by {signal.Signals(exc.signum).name}: jobs cancelled and everything torn down "
             f"in {time.monotonic() - exc.at:.1f} s; exit code {128 + exc.signum}\n")
        return 128 + exc.signum
    except KeyboardInterrupt:
        logger.error("interrupted")
        return 128 + signal.SIGINT
    except Exception as exc:
        known = _known_failure(exc)
        if known is None:
            raise
        code, hint = known
        logger.error("%s%s", exc, hint)
        return code
    return code


#: Errors of layers a command may not have imported, by module and class: the exit code each means
#: and what the message gets added. Shaping that cannot be applied is the environment (``squall
#: doctor`` says what the kernel has); a cell that cannot run is a failed run. Matched by name so
#: that a command that never imported them (``squall profiles``) does not import them here.
KNOWN_FAILURES: tuple[tuple[str, str, int, str], ...] = (
    ("squall.shaping.base", "ShapingError", EXIT_ENVIRONMENT,
     " (run 'squall doctor' to see what this machine can shape)"),
    ("squall.experiment.driver", "ExperimentError", EXIT_FAILED, ""),
)


def _known_failure(exc: Exception) -> tuple[int, str] | None:
    """The exit code and message hint of an error in :data:`KNOWN_FAILURES`, or None."""
    for module, name, code, hint in KNOWN_FAILURES:
        cls = getattr(sys.modules.get(module), name, None)
        if isinstance(cls, type) and isinstance(exc, cls):
            return code, hint
    return None


if __name__ == "__main__":
    sys.exit(main())
