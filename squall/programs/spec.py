"""What program to run and how to judge it: a frozen, validated :class:`ProgramSpec` (pure).

Built from ``squall run``'s flags (:func:`program_from_args`), from a matrix file's ``programs:``
entries or a ``@pytest.mark.squall(command=...)`` marker (:func:`program_from_mapping`). Every error
names the flag or the key and what is allowed, before anything starts.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from squall.checks.agreement import Agree, AgreeError, check_names
from squall.programs.lines import LineError, MetricPattern, parse_patterns
from squall.target import Target, TargetError

#: Keys of a ``programs:`` entry (and of the marker's program arguments).
KEYS = ("name", "command", "metrics", "target", "requirements", "pip", "workdir", "env", "exclude", "agree",
        "nproc_per_node")
MAX_NPROC = 64  # ranks per node, at most (squall.worker.local_ranks.MAX_NPROC)
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,39}$")
_ENV = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")
#: Environment a program may not set: the runner's own (torchrun's and Squall's).
RESERVED_ENV = frozenset({"MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
                          "GROUP_RANK", "GROUP_WORLD_SIZE", "ROLE_RANK", "ROLE_WORLD_SIZE", "ROLE_NAME",
                          "GLOO_SOCKET_IFNAME", "TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
                          "TORCHELASTIC_RUN_ID", "SQUALL_PEERS", "SQUALL_OUT_DIR", "SQUALL_SEED"})


class ProgramError(ValueError):
    """A program specification is invalid; the message names the flag or key and what is allowed."""


@dataclass(frozen=True)
class ProgramSpec:
    """A user's command, run as ``nproc_per_node`` ranks in each worker container (one by default)."""

    argv: tuple[str, ...]  # the command and its arguments
    name: str  # how reports and test ids call it
    workdir: str  # absolute host folder: mounted read-only, the command's current directory
    metrics: tuple[MetricPattern, ...] = ()  # figures read from stdout
    target: Target | None = None  # the figure to reach
    requirements: tuple[str, ...] = ()  # pip requirement lines for a derived image
    requirements_source: str = ""  # where they came from (a file, --pip), for messages
    env: tuple[tuple[str, str], ...] = field(default=())  # extra environment of every rank
    excludes: tuple[str, ...] = ()  # glob patterns of files the folder's snapshot leaves out (programs.snapshot)
    agree: tuple[Agree, ...] = ()  # figures every rank that finished must end with (--agree)
    nproc_per_node: int = 1  # ranks in each container, as torchrun's --nproc-per-node (global rank node * K + local)

    def __post_init__(self) -> None:
        check_nproc(self.nproc_per_node, "nproc_per_node")

    @property
    def metric_names(self) -> tuple[str, ...]:
        """Names of the stdout patterns."""
        return tuple(p.name for p in self.metrics)

    def to_json(self) -> dict[str, Any]:
        """Plain data for results and the report."""
        return {"name": self.name, "command": list(self.argv), "workdir": self.workdir,
                "metrics": {p.name: p.regex for p in self.metrics},
                "target": str(self.target) if self.target else None, "requirements": list(self.requirements),
                "env": dict(self.env), "exclude": list(self.excludes), "agree": [str(a) for a in self.agree],
                "nproc_per_node": self.nproc_per_node}


def check_nproc(value: Any, flag: str) -> int:
    """``--nproc-per-node`` (or the key): an integer in 1..:data:`MAX_NPROC`; :class:`ProgramError` naming ``flag``."""
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= MAX_NPROC:
        raise ProgramError(f"{flag}: ranks per node must be an integer in 1..{MAX_NPROC}, got {value!r}")
    return value


def default_name(argv: Sequence[str]) -> str:
    """A readable name from the command: the script's stem (``train`` for ``python train.py``)."""
    words = [w for w in argv if not w.startswith("-")]
    script = next((w for w in words[1:] if w.endswith(".py")), None) if words else None
    base = Path(script or (words[0] if words else "program")).stem
    clean = re.sub(r"[^A-Za-z0-9_.-]+", "_", base).strip("_.-") or "program"
    return clean[:40]


def read_requirements(text: str, *, source: str) -> tuple[str, ...]:
    """The requirement lines of a requirements file: comments and blanks dropped, options refused.

    Only requirement specifiers are allowed (``name``, ``name==1.2``, ``name[extra]>=1``): an option
    (``-r``, ``-e``, ``--index-url``...) or a URL would fetch from somewhere else than PyPI, or hide
    what the image holds from its tag.
    """
    lines = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.split(" #", 1)[0].strip()
        if not line or line.startswith("#"):
            continue
        if line.startswith("-") or "://" in line or line.startswith((".", "/")):
            raise ProgramError(f"{source}:{number}: {line!r}: only requirement specifiers such as 'hivemind==1.1.12' "
                               "are allowed (no options, URLs or paths)")
        if not re.match(r"^[A-Za-z0-9][A-Za-z0-9._-]*(\[[A-Za-z0-9_,.\s-]+\])?\s*([<>=!~]=?.*)?(;.*)?$", line):
            raise ProgramError(f"{source}:{number}: {line!r} is not a requirement specifier")
        lines.append(line)
    return tuple(lines)


def requirement_lines(requirements: str | None, pip: Sequence[str], *, base: Path, flag: str) -> tuple[tuple[str, ...],
                                                                                                     str]:
    lines: list[str] = []
    sources = []
    if requirements:
        path = Path(requirements)
        path = path if path.is_absolute() else base / path
        try:
            text = path.read_text()
        except OSError as exc:
            raise ProgramError(f"{flag}: cannot read {path}: {exc.strerror or exc}") from None
        lines += read_requirements(text, source=str(path))
        sources.append(str(path))
    if pip:
        lines += read_requirements("\n".join(pip), source="--pip")
        sources.append("--pip")
    return tuple(dict.fromkeys(lines)), " and ".join(sources)


def _workdir(value: str | None, *, base: Path, flag: str) -> str:
    path = Path(value) if value else base
    path = (path if path.is_absolute() else base / path).resolve()
    if not path.is_dir():
        raise ProgramError(f"{flag}: {path} is not a directory")
    return str(path)


def _argv(value: Any, flag: str) -> tuple[str, ...]:
    if isinstance(value, str):
        raise ProgramError(f"{flag}: give the command as a list of words, e.g. ['python', 'train.py'], not {value!r}")
    if not isinstance(value, list | tuple) or not value or not all(isinstance(w, str) and w for w in value):
        raise ProgramError(f"{flag}: expected a non-empty list of words (the command and its arguments), got "
                           f"{value!r:.120}")
    return tuple(value)


def _env(value: Any, flag: str) -> tuple[tuple[str, str], ...]:
    if not isinstance(value, Mapping):
        raise ProgramError(f"{flag}: expected a mapping of variable names to strings, got {value!r:.120}")
    out = []
    for k, v in value.items():
        if not isinstance(k, str) or not _ENV.match(k):
            raise ProgramError(f"{flag}: {k!r} is not an environment variable name")
        if k in RESERVED_ENV:
            raise ProgramError(f"{flag}: {k} is set by Squall for every rank; reserved: {sorted(RESERVED_ENV)}")
        if not isinstance(v, str | int | float) or isinstance(v, bool):
            raise ProgramError(f"{flag}: {k}: expected a string, got {v!r:.60}")
        out.append((k, str(v)))
    return tuple(out)


def _excludes(value: Any, flag: str) -> tuple[str, ...]:
    if not isinstance(value, list | tuple) or not all(isinstance(p, str) and p.strip() for p in value):
        raise ProgramError(f"{flag}: expected glob patterns of files to leave out, e.g. 'data/*', got {value!r:.120}")
    return tuple(value)


def agree_specs(values: Any, patterns: Sequence[MetricPattern], flag: str) -> tuple[Agree, ...]:
    """``--agree`` values: each a --metric name (or ``log:NAME``), with an optional ``~TOLERANCE``."""
    if isinstance(values, str):
        values = [values]
    if not isinstance(values, list | tuple) or not all(isinstance(v, str) for v in values):
        raise ProgramError(f"{flag}: expected figure names such as 'params' or 'loss~1e-6', got {values!r:.120}")
    try:
        agree = tuple(Agree.parse(v) for v in values)
        check_names(agree, [p.name for p in patterns], flag=flag, what="the command's --metric patterns")
    except AgreeError as exc:
        raise ProgramError(str(exc) if str(exc).startswith(flag) else f"{flag}: {exc}") from None
    return agree


def _check_name(name: str, flag: str) -> str:
    if not _NAME.match(name):
        raise ProgramError(f"{flag}: {name!r}: allowed: letters, digits, '_', '.', '-', at most 40, "
                           "starting with a letter or digit")
    return name


def program_from_args(command: Sequence[str], *, metrics: Sequence[str] = (), target: str | None = None,
                      workdir: str | None = None, requirements: str | None = None, pip: Sequence[str] = (),
                      name: str | None = None, cwd: Path | None = None, exclude: Sequence[str] = (),
                      agree: Sequence[str] = (), nproc_per_node: int = 1) -> ProgramSpec:
    """The program of ``squall run ... -- COMMAND`` (errors name the flag)."""
    base = cwd or Path(os.getcwd())
    argv = _argv(list(command), "the command after --")
    try:
        patterns = parse_patterns(metrics)
    except LineError as exc:
        raise ProgramError(f"--metric: {exc}") from None
    try:
        goal = Target.parse(target) if target else None
    except TargetError as exc:
        raise ProgramError(f"--target: {exc}") from None
    lines, source = requirement_lines(requirements, pip, base=base, flag="--requirements")
    folder = _workdir(workdir, base=base, flag="--workdir")
    return ProgramSpec(argv=argv, name=_check_name(name or default_name(argv), "--name"),
                       workdir=folder, metrics=patterns, target=goal,
                       requirements=lines, requirements_source=source, excludes=_excludes(exclude, "--exclude"),
                       agree=agree_specs(list(agree), patterns, "--agree"),
                       nproc_per_node=check_nproc(nproc_per_node, "--nproc-per-node"))


def program_from_mapping(raw: Mapping[str, Any], *, source: str, base: Path) -> ProgramSpec:
    """A ``programs:`` entry of a matrix file or a marker's program arguments (errors name ``source`` and the key).

    Keys: ``command`` (required, a list of words), ``name``, ``metrics`` ({name: regex}), ``target``
    (``'loss<=1.2'``), ``requirements`` (a file, relative to ``base``), ``pip`` (a list of
    requirement specifiers), ``workdir`` (relative to ``base``; default ``base``), ``env``, ``exclude``,
    ``agree`` and ``nproc_per_node`` (ranks per container).
    """
    if not isinstance(raw, Mapping):
        raise ProgramError(f"{source}: expected a mapping with keys {list(KEYS)}, got {raw!r:.120}")
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise ProgramError(f"{source}: unknown key(s) {unknown}; allowed: {list(KEYS)}")
    if "command" not in raw:
        raise ProgramError(f"{source}: missing key 'command' (the command as a list of words)")
    argv = _argv(raw["command"], f"{source}: command")
    metrics_raw = raw.get("metrics") or {}
    if not isinstance(metrics_raw, Mapping):
        raise ProgramError(f"{source}: metrics: expected a mapping of names to regular expressions, got "
                           f"{metrics_raw!r:.120}")
    try:
        patterns = parse_patterns(f"{k}={v}" if isinstance(v, str) else f"{k}" for k, v in metrics_raw.items())
    except LineError as exc:
        raise ProgramError(f"{source}: metrics: {exc}") from None
    target_raw = raw.get("target")
    if target_raw is not None and not isinstance(target_raw, str):
        raise ProgramError(f"{source}: target: expected a string such as 'loss<=1.2', got {target_raw!r}")
    try:
        goal = Target.parse(target_raw) if target_raw else None
    except TargetError as exc:
        raise ProgramError(f"{source}: target: {exc}") from None
    pip = raw.get("pip") or []
    if isinstance(pip, str) or not isinstance(pip, list | tuple) or not all(isinstance(p, str) for p in pip):
        raise ProgramError(f"{source}: pip: expected a list of requirement specifiers, got {pip!r:.120}")
    requirements = raw.get("requirements")
    if requirements is not None and not isinstance(requirements, str):
        raise ProgramError(f"{source}: requirements: expected a file name, got {requirements!r}")
    lines, req_source = requirement_lines(requirements, pip, base=base, flag=f"{source}: requirements")
    workdir = raw.get("workdir")
    if workdir is not None and not isinstance(workdir, str):
        raise ProgramError(f"{source}: workdir: expected a folder, got {workdir!r}")
    name = raw.get("name")
    if name is not None and not isinstance(name, str):
        raise ProgramError(f"{source}: name: expected a string, got {name!r}")
    folder = _workdir(workdir, base=base, flag=f"{source}: workdir")
    exclude = raw.get("exclude") or []
    if isinstance(exclude, str):
        exclude = [exclude]
    return ProgramSpec(argv=argv, name=_check_name(name or default_name(argv), f"{source}: name"),
                       workdir=folder, metrics=patterns,
                       target=goal, requirements=lines, requirements_source=req_source,
                       env=_env(raw.get("env") or {}, f"{source}: env"),
                       excludes=_excludes(exclude, f"{source}: exclude"),
                       agree=agree_specs(raw.get("agree") or [], patterns, f"{source}: agree"),
                       nproc_per_node=check_nproc(raw.get("nproc_per_node", 1), f"{source}: nproc_per_node"))
