"""A worker container's first process while its agent is a fork of the run's fork server.

    python -m squall.worker.standin --run-dir /squall/run -- python3 -m squall.worker.agent ...

The container lives as long as this process (``docker-init`` runs it). It waits for one of two files
in the run directory the host mounted: ``agent.pid``, written by the agent the fork server placed in
this container (:mod:`squall.worker.forkserver`), which it then watches and outlives by nothing (it
exits when the agent does, so a dead agent still ends the container as it did when the agent was
its child), passing SIGTERM and SIGINT on; or ``agent.fallback``, written by the host when the fork
did not work, on which it becomes the agent given after ``--`` (importing everything itself).
Plain stdlib: it must not pay the imports the fork server saves.
"""

from __future__ import annotations

import argparse
import contextlib
import logging
import os
import select
import signal
import sys
import time
from pathlib import Path

from squall.worker.commands import EXIT_FILE, FALLBACK_FILE, PID_FILE

logger = logging.getLogger(__name__)

POLL_S = 0.02


def _wait_for_word(run_dir: Path) -> int | None:
    """The agent's pid (in this namespace) once it wrote it, or None when told to fall back."""
    while True:
        if (run_dir / FALLBACK_FILE).exists():
            return None
        text = (run_dir / PID_FILE).read_text() if (run_dir / PID_FILE).exists() else ""
        if text.endswith("\n") and text.strip().isdigit():
            return int(text)
        time.sleep(POLL_S)


def _watch(pid: int, run_dir: Path) -> int:
    """Block until process ``pid`` ends (not our child: a pidfd says when); pass signals on."""
    def forward(signum: int, _frame: object) -> None:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signum)

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    try:
        fd = os.pidfd_open(pid)
    except ProcessLookupError:
        return _exit_code(pid, run_dir)
    while True:
        try:
            ready, _, _ = select.select([fd], [], [])
        except InterruptedError:
            continue
        if ready:
            return _exit_code(pid, run_dir)


def _exit_code(pid: int, run_dir: Path) -> int:
    """The ended agent's exit code, as it wrote it (1 when it could not)."""
    text = (run_dir / EXIT_FILE).read_text().strip() if (run_dir / EXIT_FILE).exists() else ""
    if text.lstrip("-").isdigit():
        return int(text)
    logger.error("the agent (pid %d) ended without an exit code", pid)
    return 1


def main(argv: list[str] | None = None) -> int:
    """Entry point of the worker container when its agent is forked in."""
    parser = argparse.ArgumentParser(prog="python -m squall.worker.standin", description=__doc__.splitlines()[0])
    parser.add_argument("--run-dir", type=Path, required=True, help="the run directory the host mounted")
    parser.add_argument("agent", nargs=argparse.REMAINDER, help="-- then the agent's command, for a fallback")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    command = args.agent[1:] if args.agent[:1] == ["--"] else args.agent
    if not command:
        parser.error("the agent's command is missing after --")
    pid = _wait_for_word(args.run_dir)
    if pid is None:
        logger.info("no forked agent: starting it here")
        os.execvp(command[0], command)
    return _watch(pid, args.run_dir)


if __name__ == "__main__":
    sys.exit(main())
