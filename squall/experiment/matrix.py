"""Matrices of protocol x profile x workers x seed: cells, readable ids, and validation (pure).

A matrix comes from a YAML file, from pytest options, or from a ``@pytest.mark.squall`` marker::

    protocols: [ring, butterfly, dpsgd]
    profiles: [lan, wan-5ms, lossy-1pct]
    workers: [4, 8]
    seeds: [0, 1, 2]

Beside (or instead of) ``protocols``, ``programs`` lists users' own commands
(:func:`squall.programs.spec.program_from_mapping`: name, command, metrics, target, requirements)::

    programs:
      - {name: ddp, command: [python, train.py], metrics: {loss: 'loss (\\S+)'}, target: 'loss<=1.0'}

Each cell has an id such as ``ring-wan_5ms-w8`` (``-s1`` is added when a matrix has several seeds; a program
that runs K ranks per node, ``nproc_per_node``, is ``ddp-lan-w2x2``). ``run: nproc_per_node: K`` gives every
program (and every command of ``compare:``) that does not set its own K ranks per node.
Unknown protocols or profiles and impossible sizes are rejected with the file, the key and what is
allowed, before anything starts.
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import yaml

from squall.profiles import ProfileError, load_profile
from squall.programs.spec import ProgramError, ProgramSpec, check_nproc, program_from_mapping

KEYS = ("protocols", "programs", "profiles", "workers", "seeds")
#: A protocol that lives outside Squall: its job entry point.
THIRD_PARTY = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")


class MatrixError(ValueError):
    """A matrix specification is invalid; the message names the source, the key and what is allowed."""


@dataclass(frozen=True)
class Cell:
    """One run of one protocol on one profile with a cluster size and a seed."""

    protocol: str  # protocol name, e.g. "ring" (a program's name when ``program`` is set)
    profile: str  # profile name or path, e.g. "wan-5ms"
    workers: int  # cluster size
    seed: int = 0  # run seed
    program: ProgramSpec | None = None  # a user's program instead of a protocol

    def id(self, *, with_seed: bool = False) -> str:
        """Readable test id, e.g. ``ring-wan_5ms-w8`` (``-s1`` with ``with_seed``)."""
        profile = re.sub(r"[^A-Za-z0-9]+", "_", Path(self.profile).stem)
        protocol = re.sub(r"[^A-Za-z0-9_]+", "_", self.protocol)
        nproc = self.program.nproc_per_node if self.program is not None else 1
        ranks = f"x{nproc}" if nproc > 1 else ""
        return f"{protocol}-{profile}-w{self.workers}{ranks}" + (f"-s{self.seed}" if with_seed else "")


@dataclass(frozen=True)
class Matrix:
    """The cross product of its lists, in a stable order (programs after protocols)."""

    protocols: tuple[str, ...]  # protocol names
    profiles: tuple[str, ...]  # profile names or paths
    workers: tuple[int, ...]  # cluster sizes
    seeds: tuple[int, ...] = (0,)  # seeds
    programs: tuple[ProgramSpec, ...] = ()  # users' own commands

    def cells(self) -> list[Cell]:
        """Every cell; protocols and programs innermost, then seeds: a profile runs A B C, A B C, ... seed by
        seed, so a slow drift of the host falls on every protocol alike and the seeds pair them."""
        runs: list[tuple[str, ProgramSpec | None]] = [(p, None) for p in self.protocols]
        runs += [(p.name, p) for p in self.programs]
        return [Cell(name, f, w, s, program) for w, f, s, (name, program) in
                itertools.product(self.workers, self.profiles, self.seeds, runs)]

    def ids(self) -> list[str]:
        """Ids of :meth:`cells`, unique."""
        return [c.id(with_seed=len(self.seeds) > 1) for c in self.cells()]


def _as_list(value: Any, key: str, source: str) -> list[Any]:
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    if isinstance(value, int) and not isinstance(value, bool):
        return [value]
    if isinstance(value, list | tuple):
        return list(value)
    raise MatrixError(f"{source}: {key}: expected a list or a comma-separated string, got {value!r}")


def build_matrix(raw: Mapping[str, Any], *, source: str, known_protocols: Iterable[str],
                 base: Path | None = None) -> Matrix:
    """Validate ``raw`` (keys: protocols and/or programs, profiles, workers, seeds) into a :class:`Matrix`.

    :param base: the folder a program's relative paths (workdir, requirements) start from: the
        matrix file's folder (default: the current directory).
    """
    unknown = sorted(set(raw) - set(KEYS))
    if unknown:
        raise MatrixError(f"{source}: unknown key(s) {unknown}; allowed: {list(KEYS)}")
    missing = [k for k in ("profiles", "workers") if k not in raw]
    if "protocols" not in raw and "programs" not in raw:
        missing.insert(0, "protocols (or programs)")
    if missing:
        raise MatrixError(f"{source}: missing key(s) {missing}")
    allowed = sorted(known_protocols)
    programs = _programs(raw.get("programs"), source=source, base=base or Path.cwd())
    protocols = [str(p) for p in _as_list(raw.get("protocols", []), "protocols", source)]
    for p in protocols:
        if p not in allowed and not THIRD_PARTY.match(p):
            raise MatrixError(f"{source}: protocols: unknown protocol {p!r}; allowed: {allowed} "
                              "or a third-party 'package.module:function'")
    profiles = [str(p) for p in _as_list(raw["profiles"], "profiles", source)]
    workers = _ints(_as_list(raw["workers"], "workers", source), "workers", source, low=1, high=250)
    seeds = _ints(_as_list(raw.get("seeds", [0]), "seeds", source), "seeds", source, low=0, high=2**31)
    clash = sorted({p.name for p in programs} & set(protocols))
    if clash:
        raise MatrixError(f"{source}: programs: names {clash} are also protocols of this matrix; give each a "
                          "different name (key name)")
    names = [p.name for p in programs]
    for key, values in (("protocols", protocols), ("profiles", profiles), ("workers", workers), ("seeds", seeds),
                        ("programs", names)):
        if not values and (key != "protocols" or not programs) and (key != "programs" or "programs" in raw):
            raise MatrixError(f"{source}: {key}: must not be empty")
        if len(set(values)) != len(values):
            raise MatrixError(f"{source}: {key}: duplicated entries in {values}")
    for name in profiles:
        try:
            profile = load_profile(name)
        except ProfileError as exc:
            raise MatrixError(f"{source}: profiles: {exc}") from exc
        for n in workers:
            need = profile.required_workers()
            if n < need:
                raise MatrixError(f"{source}: workers: profile {name!r} needs at least {need} workers, got {n}")
    return Matrix(tuple(protocols), tuple(profiles), tuple(workers), tuple(seeds), tuple(programs))


def _programs(raw: Any, *, source: str, base: Path) -> list[ProgramSpec]:
    if raw is None:
        return []
    if not isinstance(raw, list):
        raise MatrixError(f"{source}: programs: expected a list of programs (each with a command), got {raw!r:.120}")
    try:
        return [program_from_mapping(entry, source=f"{source}: programs[{k}]", base=base)
                for k, entry in enumerate(raw)]
    except ProgramError as exc:
        raise MatrixError(str(exc)) from None


def _ints(values: Sequence[Any], key: str, source: str, *, low: int, high: int) -> list[int]:
    out = []
    for v in values:
        try:
            number = int(v)
        except (TypeError, ValueError):
            raise MatrixError(f"{source}: {key}: {v!r} is not an integer") from None
        if isinstance(v, bool) or not low <= number <= high or str(number) != str(v).strip():
            raise MatrixError(f"{source}: {key}: {v!r} must be an integer in {low}..{high}")
        out.append(number)
    return out


@dataclass(frozen=True)
class MatrixFile:
    """A matrix file: the matrix, how each cell is run, and which claims to evaluate with it."""

    matrix: Matrix  # the cells
    run: Mapping[str, Any]  # RunSpec fields for every cell (seconds, target, lr, task, config...)
    claims: tuple[str, ...]  # claim ids from claims.yaml
    calibrate: bool = True  # calibrate each profile quickly before its first cell (key ``calibrate``)
    compare: tuple[Mapping[str, Any], ...] = ()  # baseline against candidate on every profile (key ``compare``)
    nproc_per_node: int = 1  # run: nproc_per_node: ranks per node of programs and compare commands that set none


def load_matrix_file(path: Path, *, known_protocols: Iterable[str]) -> MatrixFile:
    """A matrix file: the four matrix keys plus optional ``run`` (RunSpec fields), ``claims`` (ids) and
    ``calibrate`` (true or false)."""
    raw = _read(path)
    run, claims = raw.pop("run", {}) or {}, raw.pop("claims", []) or []
    compare = raw.pop("compare", []) or []
    compare = [compare] if isinstance(compare, dict) else compare
    if not isinstance(compare, list) or not all(isinstance(c, dict) for c in compare):
        raise MatrixError(f"{path}: compare: expected a comparison (baseline, candidate, runs...) or a list of them, "
                          f"got {compare!r:.120}")
    calibrate = raw.pop("calibrate", True)
    if not isinstance(calibrate, bool):
        raise MatrixError(f"{path}: calibrate: expected true or false, got {calibrate!r}")
    if not isinstance(run, dict):
        raise MatrixError(f"{path}: run: expected a mapping of RunSpec fields, got {run!r}")
    hang = run.get("hang_after")
    if hang is not None and (isinstance(hang, bool) or not isinstance(hang, int | float) or not hang > 0):
        raise MatrixError(f"{path}: run: hang_after: expected a number of seconds > 0, got {hang!r}")
    if not isinstance(claims, list) or not all(isinstance(c, str) for c in claims):
        raise MatrixError(f"{path}: claims: expected a list of claim ids, got {claims!r}")
    run = dict(run)
    nproc = run.pop("nproc_per_node", 1)  # a program's setting, not a protocol's (RunSpec has none)
    try:
        check_nproc(nproc, f"{path}: run: nproc_per_node")
    except ProgramError as exc:
        raise MatrixError(str(exc)) from None
    listed = raw.get("programs")
    entries: list[Any] = listed if isinstance(listed, list) else []
    matrix = build_matrix(raw, source=str(path), known_protocols=known_protocols, base=path.resolve().parent)
    if nproc != 1:
        if not matrix.programs and not compare:
            raise MatrixError(f"{path}: run: nproc_per_node: only programs run several ranks per node, and this "
                              "matrix has none (programs: or compare: with commands)")
        programs = tuple(p if isinstance(e, Mapping) and "nproc_per_node" in e else replace(p, nproc_per_node=nproc)
                         for p, e in zip(matrix.programs, entries, strict=True))
        matrix = replace(matrix, programs=programs)
    return MatrixFile(matrix, run, tuple(claims), calibrate, tuple(compare), nproc)


def _read(path: Path) -> dict[str, Any]:
    try:
        raw = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise MatrixError(f"{path}: cannot read: {exc}") from exc
    except yaml.YAMLError as exc:
        raise MatrixError(f"{path}: not valid YAML: {exc}") from exc
    if not isinstance(raw, dict):
        raise MatrixError(f"{path}: a matrix file must be a mapping with keys {list(KEYS)}")
    return raw


def load_matrix(path: Path, *, known_protocols: Iterable[str]) -> Matrix:
    """A matrix from a YAML file."""
    return build_matrix(_read(path), source=str(path), known_protocols=known_protocols, base=path.resolve().parent)
