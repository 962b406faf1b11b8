"""The layers of docs/architecture.md hold: every import in ``squall/`` goes down the table.

Every module belongs to one unit: the longest entry of :data:`UNITS` that is a prefix of its
dotted name (a package such as ``squall.transport``, a module such as ``squall.run_trace``, or each
protocol folder). A unit may import only the units of its own layer and of the layers its row
allows. Three more rules, checked on the names, not only the packages:

* a name that starts with ``_`` is private to its unit: no other unit imports it;
* a backend of the shaping layer (``squall.shaping.netem``, ``squall.shaping.nfqueue``) is
  self-contained: only the backend chooser (``squall.shaping.select``) and the backend's own
  modules import it, so the generic shaping modules never reach into a backend's internals;
* the worker side (what runs in the containers) never imports the host side.

A new package must be placed in the table (an unplaced module fails), and a crossing fails with
the file and line that made it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from squall.protocols.catalog import DECLARATION_MODULE

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "squall"


@dataclass(frozen=True)
class Layer:
    name: str
    side: str  # "worker" (runs in the containers) or "host"
    units: frozenset[str]
    may_import: frozenset[str]  # other layers


def _layer(name: str, side: str, units: set[str], may_import: set[str] | frozenset[str] = frozenset()) -> Layer:
    return Layer(name, side, frozenset(units), frozenset(may_import))


WORKER_BASE = {"wire", "transport", "job interface", "training"}

#: Bottom to top. "protocol folders" is filled with every folder that has a protocol.py.
LAYERS: tuple[Layer, ...] = (
    _layer("package root", "worker", {"squall", "squall.record", "squall.fingerprint"}),
    # The one target (figure, direction, value): plain data both sides share; every layer may use it.
    _layer("target", "worker", {"squall.target"}),
    _layer("wire", "worker", {"squall.wire"}),
    _layer("transport", "worker", {"squall.transport"}, {"wire"}),
    _layer("job interface", "worker", {"squall.job", "squall.programs.lines"}),
    # The control sockets' framing (one JSON object per line) and the job agent's commands: stdlib only,
    # shared by the agent in the containers and the host's clients of it.
    _layer("control", "worker", {"squall.worker.jsonline", "squall.worker.commands"}),
    _layer("training", "worker", {"squall.training"}, {"wire", "transport", "job interface"}),
    _layer("shared", "worker", {"squall.collectives", "squall.gossip", "squall.lowcomm"}, WORKER_BASE),
    _layer("protocol folders", "worker", set(), WORKER_BASE | {"shared"}),
    _layer("entry", "worker",
           {"squall.protocols", "squall.protocols.catalog", "squall.protocols.train", "squall.worker", "squall.bench",
            "squall.calibration.probes"},
           WORKER_BASE | {"shared", "protocol folders", "control"}),
    # The host side. Every host layer may also use the asset locator.
    _layer("assets", "host", {"squall.assets"}),
    _layer("profiles", "host", {"squall.profiles"}),
    _layer("shaping", "host", {"squall.shaping"}, {"profiles"}),
    _layer("cluster", "host", {"squall.cluster"}, {"profiles", "shaping", "control"}),
    _layer("trace", "host", {"squall.run_trace", "squall.run_meta", "squall.progress"}),
    # squall compare's statistics: pure numbers in, a ratio, an interval and a verdict out (numpy, scipy.stats).
    _layer("compare", "host", {"squall.compare"}),
    # The checks hold the one validity (pass, fail, unknown) and its merge rule, which calibration uses too.
    _layer("checks", "host", {"squall.checks"}, {"trace"}),
    _layer("calibration", "host", {"squall.calibration"}, {"profiles", "shaping", "cluster", "checks"}),
    _layer("programs", "host", {"squall.programs"}, {"checks", "trace", "program lines"}),
    _layer("timeline", "host", {"squall.experiment.timeline"}, {"profiles", "trace"}),
    _layer("matrix", "host", {"squall.experiment", "squall.experiment.matrix"}, {"profiles", "programs"}),
    _layer("report", "host", {"squall.report"}, {"checks", "trace", "profiles", "compare"}),
    _layer("experiment", "host", {"squall.experiment.lab", "squall.experiment.realised", "squall.experiment.program",
                                  "squall.experiment.driver", "squall.experiment.hangs",
                                  "squall.experiment.job_mirror"},
           {"profiles", "shaping", "cluster", "trace", "timeline", "protocol catalog", "programs", "checks"}),
    _layer("claims", "host", {"squall.claims", "squall.experiment.runner", "squall.experiment.fidelity",
                              "squall.experiment.replay", "squall.experiment.session", "squall.experiment.comparison"},
           {"checks", "trace", "report", "matrix", "experiment", "calibration", "protocol catalog", "programs",
            "compare"}),
    _layer("front", "host", {"squall.cli", "squall.pytest_plugin"},
           {"profiles", "shaping", "cluster", "calibration", "trace", "checks", "timeline", "matrix", "report",
            "experiment", "claims", "protocol catalog", "training", "programs"}),
)
#: What the host may use of the worker side: the catalog (names, declarations), the job
#: interface (a pure-maths claim's function is resolved by name), the training layer's plain
#: data (the device model's draws), the stdout-line parsing a program's runner shares with
#: the host (patterns are validated on the host before they reach the containers) and the control
#: sockets' framing and commands (the host's agent clients speak them). Everything else of the
#: worker side runs in the containers.
HOST_SEES = {"squall.protocols.catalog": "protocol catalog", "squall.job": "protocol catalog",
             "squall.target": "target", "squall.training": "training",
             "squall.programs.lines": "program lines", "squall.worker.jsonline": "control",
             "squall.worker.commands": "control"}

#: Third-party packages that only some modules (or the packages named) may import.
CONFINED = {
    "docker": ("squall.cluster",),
    "requests": ("squall.cluster",),  # the engine's transport errors
    "pyroute2": ("squall.shaping",),
    "pytest": ("squall.pytest_plugin",),
    "matplotlib": ("squall.report.plots",),  # every plot is drawn there; the pages only lay them out
}

#: A backend is self-contained: outside it, only these modules may import it.
BACKENDS = {"squall.shaping.netem": ("squall.shaping.select",), "squall.shaping.nfqueue": ("squall.shaping.select",)}

#: ``squall.shaping.planning`` is pure: besides itself it may import only these (netlink's framing
#: builds bytes; it is in ``kernel/`` because every sender there shares it).
PLANNING_SEES = ("squall.profiles", "squall.shaping.base", "squall.shaping.planning", "squall.shaping.kernel.netlink")
#: Namespaces for tests and benchmarks: no library module outside the folder uses them.
TESTNET = "squall.shaping.testnet"


def protocol_folders() -> frozenset[str]:
    """Every direct subpackage of squall/protocols/ that declares protocols."""
    return frozenset(f"squall.protocols.{p.parent.name}"
                     for p in (ROOT / "protocols").glob(f"*/{DECLARATION_MODULE}.py"))


def layers() -> tuple[Layer, ...]:
    return tuple(Layer(lay.name, lay.side, protocol_folders(), lay.may_import) if lay.name == "protocol folders"
                 else lay for lay in LAYERS)


def unit_of(module: str, units: frozenset[str]) -> str | None:
    """The longest unit that is ``module`` or a package holding it."""
    parts = module.split(".")
    for n in range(len(parts), 0, -1):
        candidate = ".".join(parts[:n])
        if candidate in units:
            return candidate
    return None


def module_of(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> Iterator[tuple[int, str, tuple[str, ...]]]:
    """(line, absolute module, names taken from it) for every import in ``path``, also inside functions."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name, ()) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            yield node.lineno, node.module, tuple(alias.name for alias in node.names)


def _modules_named(module: str, names: tuple[str, ...], known: set[str]) -> list[str]:
    """``from squall import cli`` imports the module ``squall.cli``: the target is the module, not the package."""
    submodules = [f"{module}.{n}" for n in names if f"{module}.{n}" in known]
    return submodules or [module]


def violations() -> list[str]:
    table = layers()
    layer_of = {unit: lay for lay in table for unit in lay.units}
    units = frozenset(layer_of)
    paths = sorted(ROOT.rglob("*.py"))
    known = {module_of(p) for p in paths}
    found: list[str] = []
    for path in paths:
        here = module_of(path)
        unit = unit_of(here, units)
        where = path.relative_to(REPO)
        if unit is None:
            found.append(f"{where}: {here} is in no layer (add it to LAYERS here and to docs/architecture.md)")
            continue
        layer = layer_of[unit]
        allowed = {layer.name, "target"} | layer.may_import | ({"assets"} if layer.side == "host" else set())
        if layer.name == "protocol folders":
            allowed.discard("protocol folders")  # each folder stands alone: checked below by name
        for line, module, names in imports(path):
            top = module.split(".")[0]
            if top in CONFINED and not any(here == u or here.startswith(u + ".") for u in CONFINED[top]):
                found.append(f"{where}:{line}: {here} imports {top}, which only {CONFINED[top]} may")
            if top != "squall":
                continue
            for target_module in _modules_named(module, names, known):
                target_unit = unit_of(target_module, units)
                if target_unit is None or target_unit == unit:
                    continue
                found += _crossing(f"{where}:{line}", unit, layer, allowed, target_module=target_module,
                                   target_unit=target_unit, layer_of=layer_of)
                found += [f"{where}:{line}: {unit} imports the private name {name} of {target_module}"
                          for name in names if name.startswith("_") and not name.startswith("__")]
            for backend, outsiders in BACKENDS.items():
                inside = here == backend or here.startswith(backend + ".")
                if (module == backend or module.startswith(backend + ".")) and not inside and here not in outsiders:
                    found.append(f"{where}:{line}: {here} reaches into the backend {backend} ({module}); only "
                                 f"{outsiders} and the backend itself may")
    return found


def _crossing(where: str, unit: str, layer: Layer, allowed: set[str], *, target_module: str, target_unit: str,
              layer_of: dict[str, Layer]) -> list[str]:
    target = layer_of[target_unit]
    if layer.side == "host" and target.side == "worker":
        seen = HOST_SEES.get(target_unit)
        if seen is None:
            return [f"{where}: {unit} (host) imports {target_module}, which runs in the containers; the host "
                    f"may use only {sorted(HOST_SEES)}"]
        return [] if seen in allowed else [f"{where}: {unit} ({layer.name}) imports {target_module} ({seen})"]
    if layer.side == "worker" and target.side == "host":
        return [f"{where}: {unit} runs in the containers and imports the host side ({target_module})"]
    if target.name not in allowed:
        return [f"{where}: {unit} ({layer.name}) imports {target_module} ({target.name}); {layer.name} may import "
                f"{sorted(allowed - {layer.name})}"]
    return []


def test_every_import_goes_down_the_layers() -> None:
    assert violations() == []


def test_every_unit_of_the_table_exists() -> None:
    """A stale row (a unit renamed or removed) fails too, so the table stays the architecture's."""
    known = {module_of(p) for p in ROOT.rglob("*.py")}
    missing = [u for lay in layers() for u in lay.units if u not in known]
    assert missing == []


def _inside(module: str, unit: str) -> bool:
    return module == unit or module.startswith(unit + ".")


def test_shaping_planning_is_pure_and_testnet_is_for_tests() -> None:
    """The roles of squall/shaping/'s folders hold: a plan does no I/O, and only tests build test nets."""
    crossing = []
    for path in sorted(ROOT.rglob("*.py")):
        here = module_of(path)
        for line, module, _ in imports(path):
            if module.split(".")[0] != "squall":
                continue
            if _inside(here, "squall.shaping.planning") and not any(_inside(module, u) for u in PLANNING_SEES):
                crossing.append(f"{path.relative_to(REPO)}:{line}: the pure planning imports {module}")
            if _inside(module, TESTNET) and not _inside(here, TESTNET):
                crossing.append(f"{path.relative_to(REPO)}:{line}: {here} uses the test net {module}")
    assert crossing == []


def test_protocol_folders_do_not_import_each_other() -> None:
    """Spelled out, because it is the rule adding a protocol relies on: a folder can be removed alone."""
    folders = protocol_folders()
    assert {"squall.protocols.allreduce", "squall.protocols.moshpit", "squall.protocols.swarm",
            "squall.protocols.matcha"} <= folders
    crossing = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for folder in folders
        for path in (REPO / Path(*folder.split("."))).rglob("*.py")
        for line, module, _ in imports(path)
        if unit_of(module, folders) not in (None, folder)
    ]
    assert crossing == []


def test_the_checker_sees_a_crossing(tmp_path: Path) -> None:
    """The walk finds imports inside functions too, so a lazy import cannot hide a crossing."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from squall.protocols.moshpit.sgd import MoshpitSGD\n    import docker\n")
    assert list(imports(source)) == [(2, "squall.protocols.moshpit.sgd", ("MoshpitSGD",)), (3, "docker", ())]


@pytest.mark.parametrize(("module", "unit"), [
    ("squall.shaping.nfqueue.daemon", "squall.shaping"),
    ("squall.calibration.probes", "squall.calibration.probes"),
    ("squall.worker.jsonline", "squall.worker.jsonline"),
    ("squall.worker.agent", "squall.worker"),
    ("squall.calibration.runner", "squall.calibration"),
    ("squall.experiment.lab", "squall.experiment.lab"),
    ("squall.experiment.realised", "squall.experiment.realised"),
    ("squall.experiment.replay", "squall.experiment.replay"),
    ("squall.shaping.clock.sender", "squall.shaping"),
    ("squall.profiles.link_traces", "squall.profiles"),
    ("squall.protocols.moshpit.sgd", "squall.protocols.moshpit"),
])
def test_a_module_belongs_to_its_longest_unit(module: str, unit: str) -> None:
    units = frozenset(u for lay in layers() for u in lay.units)
    assert unit_of(module, units) == unit
