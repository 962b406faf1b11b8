"""The protocols a matrix can name, found where they are declared rather than listed here.

Three sources, read once per process (:func:`discover`, cached):

1. every subpackage of :mod:`protocols` that has a ``protocol`` module: its ``DECLARATIONS``
   (:mod:`squall.training.declaration`); the scan reads the folders, and imports only the
   packages that have one;
2. the entry points of the group ``squall.protocols`` in the installed distributions; each loads a
   declaration, a sequence of them, or a module exporting ``DECLARATIONS``
   (``[project.entry-points."squall.protocols"] mine = "mypkg.protocol:DECLARATIONS"``);
3. a name of the form ``package.module:function`` (:func:`lookup` only): a third-party job run
   with the config the caller gives.

A name declared twice, by any two sources, is an error that names both. ``squall protocols``
lists what was found. :func:`make_algorithm` builds the shared ``train`` job's algorithm by name.
"""

from __future__ import annotations

import functools
import importlib
import importlib.metadata
import importlib.util
import logging
import pkgutil
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import MappingProxyType, ModuleType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # at run time imported where used: squall.training loads torch, and the harness
    # imports this module to build its command line
    from squall.training.algorithms.base import Algorithm
    from squall.training.declaration import AlgorithmDeclaration, AnyDeclaration, Declaration, JobDeclaration
    from squall.training.optim import Sgd
    from squall.transport import Transport

logger = logging.getLogger(__name__)

ENTRY_POINT_GROUP = "squall.protocols"
DECLARATION_MODULE = "protocol"  # protocols/<folder>/protocol.py
DECLARATIONS_ATTR = "DECLARATIONS"

#: Where declarations came from: (source, declarations); source is a module or distribution.
Found = tuple[str, Sequence["AnyDeclaration"]]


@dataclass(frozen=True)
class Catalog:
    """Everything the sources declared, by name, and where each protocol came from."""

    protocols: Mapping[str, Declaration]  # by protocol name
    jobs: Mapping[str, JobDeclaration]  # by job name (the registry's utility jobs are not here)
    algorithms: Mapping[str, AlgorithmDeclaration]  # by algorithm name (the shared train job's)
    sources: Mapping[str, str]  # protocol name -> module path or distribution that declared it


def collect(found: Iterable[Found]) -> Catalog:
    """One catalog from every source's declarations; a name declared twice is a :class:`DeclarationError`."""
    from squall.training.declaration import Declaration, DeclarationError, JobDeclaration

    tables: dict[str, dict[str, tuple[AnyDeclaration, str]]] = {"protocol": {}, "job": {}, "algorithm": {}}
    for source, declarations in found:
        for d in declarations:
            kind = "protocol" if isinstance(d, Declaration) else "job" if isinstance(d, JobDeclaration) else "algorithm"
            table = tables[kind]
            if d.name in table:
                raise DeclarationError(f"{kind} {d.name!r} is declared twice: by {table[d.name][1]} "
                                       f"and by {source}; rename one of them")
            table[d.name] = (d, source)
    return Catalog(
        protocols=_by_name(tables["protocol"]),
        jobs=_by_name(tables["job"]),
        algorithms=_by_name(tables["algorithm"]),
        sources=MappingProxyType({name: source for name, (_, source) in sorted(tables["protocol"].items())}),
    )


def _by_name(rows: Mapping[str, tuple[AnyDeclaration, str]]) -> Mapping[str, Any]:
    """Name -> declaration, sorted by name, read-only (the kind was checked when the rows were filled)."""
    return MappingProxyType({name: declaration for name, (declaration, _) in sorted(rows.items())})


def declarations_of(obj: object, source: str) -> tuple[AnyDeclaration, ...]:
    """The declarations ``obj`` holds: one, a sequence of them, or a module exporting ``DECLARATIONS``."""
    from squall.training.declaration import AlgorithmDeclaration, Declaration, DeclarationError, JobDeclaration

    if isinstance(obj, ModuleType):
        if not hasattr(obj, DECLARATIONS_ATTR):
            raise DeclarationError(f"{source}: module {obj.__name__!r} exports no {DECLARATIONS_ATTR}")
        obj = getattr(obj, DECLARATIONS_ATTR)
    if isinstance(obj, Declaration | JobDeclaration | AlgorithmDeclaration):
        return (obj,)
    if isinstance(obj, Sequence) and not isinstance(obj, str):
        bad = [type(d).__name__ for d in obj if not isinstance(d, Declaration | JobDeclaration | AlgorithmDeclaration)]
        if not bad:
            return tuple(obj)
        what = f"a sequence holding {sorted(set(bad))}"
    else:
        what = type(obj).__name__
    raise DeclarationError(f"{source}: expected a Declaration, JobDeclaration or AlgorithmDeclaration, a sequence "
                           f"of them, or a module exporting {DECLARATIONS_ATTR}; got {what}")


def scan(package: str) -> list[Found]:
    """The ``protocol`` module of every direct subpackage of ``package`` that has one, imported."""
    root = importlib.import_module(package)
    found: list[Found] = []
    for info in sorted(pkgutil.iter_modules(root.__path__), key=lambda m: m.name):
        folders = [str(Path(path) / info.name) for path in root.__path__]
        if info.ispkg and any(m.name == DECLARATION_MODULE for m in pkgutil.iter_modules(folders)):
            name = f"{package}.{info.name}.{DECLARATION_MODULE}"
            try:
                module = importlib.import_module(name)
            except ImportError as exc:
                exc.add_note(f"while reading the protocol declarations of {name}")
                raise
            found.append((name, declarations_of(module, name)))
    return found


def from_entry_points(group: str = ENTRY_POINT_GROUP) -> list[Found]:
    """What the installed distributions declare under the entry-point ``group``."""
    from squall.training.declaration import DeclarationError

    found: list[Found] = []
    for point in importlib.metadata.entry_points(group=group):
        source = f"entry point {point.name} = {point.value!r}"
        if point.dist is not None:
            source = f"{point.dist.name} {point.dist.version} ({source})"
        try:
            loaded = point.load()
        except Exception as exc:  # a broken plugin must say which one it is
            raise DeclarationError(f"{source}: cannot load it ({type(exc).__name__}: {exc})") from exc
        found.append((source, declarations_of(loaded, source)))
    return found


@functools.cache
def discover() -> Catalog:
    """The protocols package's folders plus the entry-point group, read once (see the module docstring)."""
    catalog = collect([*scan("squall.protocols"), *from_entry_points()])
    logger.debug("catalog: %d protocols, %d jobs, %d algorithms",
                 len(catalog.protocols), len(catalog.jobs), len(catalog.algorithms))
    return catalog


class _Discovered(Mapping[str, "Declaration"]):
    """The discovered protocols by name, read on first use (importing this module stays cheap)."""

    def __getitem__(self, name: str) -> Declaration:
        return discover().protocols[name]

    def __iter__(self) -> Iterator[str]:
        return iter(discover().protocols)

    def __len__(self) -> int:
        return len(discover().protocols)

    def __repr__(self) -> str:
        return f"PROTOCOLS({sorted(self)})"


#: Every discovered protocol by name (a read-only mapping, filled on first use).
PROTOCOLS: Mapping[str, Declaration] = _Discovered()


def lookup(name: str) -> Declaration:
    """The protocol called ``name``; ``package.module:function`` names a third-party entry point."""
    from squall.training.declaration import Declaration

    known = discover().protocols
    if name in known:
        return known[name]
    if ":" in name:
        return Declaration(name, "third-party protocol", name)
    raise KeyError(f"unknown protocol {name!r}; known: {sorted(known)}, or give 'package.module:function'")


@dataclass(frozen=True)
class ThirdPartyCode:
    """The host files a protocol declared outside Squall needs in the containers (:func:`third_party_code`)."""

    distribution: str  # the installed distribution that declared it, e.g. "myproto 0.1.0"
    modules: tuple[Path, ...]  # its top-level packages (folders) or single-module files the containers import
    metadata: Path | None  # its metadata folder (``*.dist-info``: the entry points), for the containers' catalog


def third_party_code(name: str) -> ThirdPartyCode | None:
    """Where the code of protocol ``name`` lives on the host, when an installed distribution declared it
    under the entry-point group ``squall.protocols``; None for Squall's own protocols (and for
    ``package.module:function`` names, which are not declared).

    The containers need the top-level package of the entry point's module and of the declaration's
    job (``Declaration.entry``, when it is a ``package.module:function``), plus the distribution's
    metadata folder, so that the catalog inside the containers finds the same declarations (a job or
    an algorithm declared by name resolves there as here).

    :raises DeclarationError: the package of one of them cannot be found on the host.
    """
    protocol = discover().protocols.get(name)  # loads every entry point once (a broken one raises here)
    if protocol is None:
        return None
    for point in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if name not in {d.name for d in declarations_of(point.load(), point.name)}:
            continue
        tops = [point.module.split(".", 1)[0]]
        if ":" in protocol.entry:
            tops.append(protocol.entry.split(":", 1)[0].split(".", 1)[0])
        modules = tuple(_module_path(top, f"protocol {name!r} ({point.value})") for top in dict.fromkeys(tops)
                        if top != "squall")
        dist = point.dist
        label = f"{dist.name} {dist.version}" if dist is not None else f"entry point {point.name}"
        return ThirdPartyCode(label, modules, _metadata_dir(dist) if dist is not None else None)
    return None


def _module_path(top: str, what: str) -> Path:
    """The folder of top-level package ``top``, or its module file, found with the host's import system."""
    from squall.training.declaration import DeclarationError

    spec = importlib.util.find_spec(top)
    if spec is not None and spec.submodule_search_locations:
        return Path(next(iter(spec.submodule_search_locations)))
    if spec is not None and spec.origin and spec.origin.endswith(".py"):
        return Path(spec.origin)
    raise DeclarationError(f"{what}: package {top!r} is not importable on this host, or has no folder or file")


def _metadata_dir(dist: importlib.metadata.Distribution) -> Path | None:
    """The ``*.dist-info`` folder of an installed distribution (where its entry points are written)."""
    for file in dist.files or ():
        if file.parts and file.parts[0].endswith((".dist-info", ".egg-info")) and file.name == "METADATA":
            return Path(str(dist.locate_file(file))).parent
    path = getattr(dist, "_path", None)  # a PathDistribution without a RECORD
    return Path(path) if path is not None else None


def source_of(name: str) -> str:
    """Where protocol ``name`` was declared: its module, or the distribution and entry point."""
    return discover().sources[name]


def algorithms() -> dict[str, AlgorithmDeclaration]:
    """Every algorithm the ``train`` job can build, by name: ``local`` plus the declared ones.

    :raises DeclarationError: a protocol folder declares ``local``.
    """
    from squall.training.algorithms import LOCAL
    from squall.training.declaration import DeclarationError

    declared = discover().algorithms
    if LOCAL.name in declared:
        raise DeclarationError(f"algorithm {LOCAL.name!r} is built in (squall/training/algorithms); "
                               "a protocol folder declares it too")
    return {LOCAL.name: LOCAL, **declared}


def make_algorithm(
    name: str, transport: Transport, *, optimizer: Sgd | None = None, options: Mapping[str, Any] | None = None
) -> Algorithm:
    """The algorithm ``name`` over ``transport`` with ``options`` (declared by the protocol folders, or ``local``).

    ``options`` are read into the declaration's options dataclass (:func:`~squall.training.options.read_options`).

    :raises ValueError: unknown name, unknown option or a value its options class refuses.
    """
    from squall.training.optim import Sgd
    from squall.training.options import read_options

    known = algorithms()
    if name not in known:
        raise ValueError(f"unknown algorithm {name!r}; known: {sorted(known)}")
    declared = known[name]
    if declared.options is not None:
        return declared.build(transport, optimizer or Sgd(), read_options(declared.options, options,
                                                                           where=f"algorithm {name!r}"))
    remaining = dict(options or {})
    algorithm = declared.build(transport, optimizer or Sgd(), remaining)
    if remaining:
        raise ValueError(f"algorithm {name!r} does not take options {sorted(remaining)}")
    return algorithm
