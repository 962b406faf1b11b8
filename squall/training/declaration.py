"""What a protocol folder says about itself: one module, ``protocols/<folder>/protocol.py``.

That module exports ``DECLARATIONS``, a tuple holding any mix of

* :class:`Declaration`: a protocol a matrix can name (``dpsgd``, ``moshpit`` ...);
* :class:`JobDeclaration`: a job entry point with a short name (``moshpit_average``);
* :class:`AlgorithmDeclaration`: an algorithm the shared ``train`` job can build by name.

:mod:`squall.protocols.catalog` finds these modules (and third-party ones, through the entry-point
group ``squall.protocols``); nothing else keeps a table of names. This module is plain data: it
imports nothing from the protocols, so a declaration module stays cheap to read.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field, is_dataclass
from types import MappingProxyType
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from squall.training.algorithms.base import Algorithm
    from squall.training.optim import Sgd
    from squall.transport import Transport

#: What a protocol may need from the cluster, and what each means.
NEEDS: Mapping[str, str] = MappingProxyType({
    "device_model": "honours the profile's emulated devices (compute slow-down, stragglers)",
    "tcp": "talks TCP between the workers",
    "udp": "talks UDP between the workers (shaping must cover datagrams)",
    "torch_distributed": "needs torch.distributed with the gloo backend in the worker image",
})

#: ``(transport, local optimiser, options) -> Algorithm``. ``options`` is an instance of the
#: declaration's options dataclass, read from ``config["algorithm_args"]`` by
#: :func:`squall.training.options.read_options` (so its fields are the keys the algorithm takes);
#: a declaration without one (a builder written elsewhere before options classes) gets a ``dict``
#: instead, pops the keys it understands, and :func:`squall.protocols.catalog.make_algorithm`
#: rejects the rest.
Builder = Callable[["Transport", "Sgd", Any], "Algorithm"]


class DeclarationError(ValueError):
    """A declaration is malformed, or two sources declare one name; says which and what is allowed."""


def _check_name(kind: str, name: str) -> None:
    if not name or not name.isidentifier():
        raise DeclarationError(f"{kind} name {name!r} must be a non-empty identifier (letters, digits, _)")


def _check_entry(owner: str, entry: str) -> None:
    module, sep, attr = entry.partition(":")
    if sep and not (module and attr.isidentifier()):
        raise DeclarationError(f"{owner}: entry {entry!r} must be a job name or 'package.module:function'")
    if not sep:
        _check_name(f"{owner}: entry job", entry)


@dataclass(frozen=True)
class Declaration:
    """One protocol a matrix can name, and how to run it as a job."""

    name: str  # what matrices, RunSpec and ``squall run --protocol`` say
    description: str  # one line for listings
    entry: str  # job entry point: a job name (registry or JobDeclaration) or "package.module:function"
    config: Mapping[str, Any] = field(default_factory=dict)  # keys laid under the run's own config
    paper: str = ""  # citation ("Authors, Venue Year"); empty for baselines
    #: The job can join a run already under way: a node that churn restarts is given it again
    #: (the run's config; the job counts the time budget on the run's clock, as Moshpit does from its
    #: peers' heartbeats), instead of staying out for the rest of the run.
    rejoins: bool = False
    needs: frozenset[str] = frozenset()  # keys of NEEDS

    def __post_init__(self) -> None:
        if not (":" in self.name and self.name == self.entry):  # else: a third-party job named as such
            _check_name("protocol", self.name)
        _check_entry(f"protocol {self.name!r}", self.entry)
        if not isinstance(self.needs, frozenset):
            raise DeclarationError(f"protocol {self.name!r}: needs must be a frozenset, "
                                   f"got {type(self.needs).__name__}")
        unknown = sorted(self.needs - NEEDS.keys())
        if unknown:
            raise DeclarationError(f"protocol {self.name!r}: unknown needs {unknown}; allowed: {sorted(NEEDS)}")
        object.__setattr__(self, "config", MappingProxyType(dict(self.config)))


@dataclass(frozen=True)
class JobDeclaration:
    """A job entry point a protocol folder provides under a short name."""

    name: str  # what a job spec or ``Declaration.entry`` says
    target: str  # "package.module:function", imported only when the job runs

    def __post_init__(self) -> None:
        _check_name("job", self.name)
        if ":" not in self.target:
            raise DeclarationError(f"job {self.name!r}: target {self.target!r} must be 'package.module:function'")
        _check_entry(f"job {self.name!r}", self.target)


@dataclass(frozen=True)
class AlgorithmDeclaration:
    """An algorithm the shared ``train`` job builds by name (``config["algorithm"]``)."""

    name: str  # what ``config["algorithm"]`` says
    build: Builder  # see Builder
    options: type[Any] | None = None  # frozen dataclass of its options (its fields are the keys); see Builder

    def __post_init__(self) -> None:
        _check_name("algorithm", self.name)
        if not callable(self.build):
            raise DeclarationError(f"algorithm {self.name!r}: build must be callable")
        if self.options is not None and not (isinstance(self.options, type) and is_dataclass(self.options)):
            raise DeclarationError(f"algorithm {self.name!r}: options must be a dataclass (its fields are the "
                                   f"keys the algorithm takes), got {self.options!r}")


#: Anything a declaration module or entry point may hold.
AnyDeclaration = Declaration | JobDeclaration | AlgorithmDeclaration
