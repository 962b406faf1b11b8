"""Where a run came from: the command, Squall's version and commit, the host, Docker and the host's load.

A report's reproduce block is built from this plain data, so a reader can rerun the same thing on
the same kind of host and tell a busy host from a slow protocol. Every function returns plain
data (str, int, float, lists, dicts) ready for ``results.json``; none raises when a source is
missing (no git checkout, no Docker): the value is ``"unknown"`` instead.

Typical use (what ``squall matrix``, ``squall run``, the plugin and the demo put in ``Results.meta``)::

    prov = provenance.collect()                 # before the runs: load before
    ...                                         # run the cells
    meta["provenance"] = provenance.finish(prov)  # after: load after, elapsed time
"""

from __future__ import annotations

import logging
import os
import platform
import shlex
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from importlib import metadata
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

UNKNOWN = "unknown"
DISTRIBUTION = "squall"  # the package name in pyproject.toml
ROOT = Path(__file__).resolve().parents[1]  # the checkout (or site-packages for a wheel)
TIMEOUT_S = 5.0  # for git and docker: a hung daemon must not hang the report


def command_line(argv: Sequence[str] | None = None) -> str:
    """The command as a shell would take it back: ``squall matrix --file m.yaml`` (argv[0] shortened)."""
    args = list(sys.argv if argv is None else argv)
    if not args:
        return UNKNOWN
    head = Path(args[0]).name
    if head == "__main__.py":  # python -m package
        head = f"python -m {Path(args[0]).parent.name}"
    return " ".join([head, *(shlex.quote(a) for a in args[1:])])


def version() -> str:
    """Squall's installed version, or the checkout's pyproject version, or ``unknown``."""
    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        pass
    pyproject = ROOT / "pyproject.toml"
    if pyproject.is_file():
        for line in pyproject.read_text().splitlines():
            if line.startswith("version") and "=" in line:
                return line.split("=", 1)[1].strip().strip('"')
    return UNKNOWN


def _run(cmd: Sequence[str], cwd: Path | None = None) -> str | None:
    try:
        done = subprocess.run(list(cmd), cwd=cwd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False)
    except (OSError, subprocess.SubprocessError) as exc:
        logger.debug("%s: %s", cmd[0], exc)
        return None
    return done.stdout.strip() if done.returncode == 0 else None


def git_commit(root: Path = ROOT) -> dict[str, Any]:
    """The commit of the checkout the code runs from and whether it had local changes."""
    commit = _run(["git", "rev-parse", "HEAD"], cwd=root)
    if not commit:
        return {"commit": UNKNOWN, "dirty": None}
    status = _run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=root)
    return {"commit": commit, "dirty": bool(status) if status is not None else None}


def docker_version() -> str:
    """The Docker engine's server version (through the CLI: the only place here that asks Docker)."""
    return _run(["docker", "version", "--format", "{{.Server.Version}}"]) or UNKNOWN


def host_load() -> list[float]:
    """The 1, 5 and 15 minute load averages, rounded."""
    try:
        return [round(v, 2) for v in os.getloadavg()]
    except OSError:
        return []


def kernel() -> str:
    """``Linux 6.1.0-18-amd64 x86_64``."""
    u = platform.uname()
    return f"{u.system} {u.release} {u.machine}"


def collect(argv: Sequence[str] | None = None, *, root: Path = ROOT) -> dict[str, Any]:
    """Everything known before a run: command, version, commit, kernel, Python, CPUs, Docker, load before."""
    return {
        "command": command_line(argv),
        "cwd": os.getcwd(),
        "squall_version": version(),
        **git_commit(root),
        "kernel": kernel(),
        "python": platform.python_version(),
        "cpus": os.cpu_count() or 0,
        "docker": docker_version(),
        "load_before": host_load(),
        "started_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "_started": time.time(),
    }


def finish(before: Mapping[str, Any]) -> dict[str, Any]:
    """``before`` with the load after the run and the elapsed seconds added (a new dict)."""
    out = {k: v for k, v in before.items() if not k.startswith("_")}
    started = before.get("_started")
    if isinstance(started, int | float):
        out["elapsed_s"] = round(time.time() - started, 1)
    out["load_after"] = host_load()
    return out
