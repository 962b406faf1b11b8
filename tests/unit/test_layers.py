"""The layers of docs/architecture.md hold: every import in protocols/ and harness/ goes down the table.

Each module belongs to one unit (a package such as ``protocols.transport`` or a top-level module
such as ``harness.trace``); a unit may import only the units its layer allows. The table here is
the one the architecture page shows; a new package must be placed in it (an unplaced unit fails),
and a new edge that crosses the layers fails with the file and line that made it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from protocols.catalog import DECLARATION_MODULE

REPO = Path(__file__).resolve().parents[2]

#: Third-party packages that only one place may import.
CONFINED = {
    "docker": ("harness.cluster",),
    "requests": ("harness.cluster",),  # the engine's transport errors
    "pyroute2": ("harness.shaping",),
    "pytest": ("harness.pytest_plugin",),
    "matplotlib": ("harness.report", "harness.report_plots"),
}

#: protocols/: layer name -> (units in it, layers it may import besides its own).
PROTOCOL_LAYERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "wire": (frozenset({"protocols.wire"}), frozenset()),
    "transport": (frozenset({"protocols.transport"}), frozenset({"wire"})),
    "job interface": (frozenset({"protocols.job"}), frozenset()),
    "common": (frozenset({"protocols.common"}), frozenset({"wire", "transport", "job interface"})),
    "shared": (frozenset({"protocols.collectives", "protocols.gossip"}),
               frozenset({"wire", "transport", "job interface", "common"})),
    # "protocol folders" holds every package with a protocol.py: filled in by protocol_folders().
    "protocol folders": (frozenset(), frozenset({"wire", "transport", "job interface", "common", "shared"})),
    "entry": (frozenset({"protocols.catalog", "protocols.registry", "protocols.train", "protocols.worker",
                         "protocols.agent", "protocols.jobs"}),
              frozenset({"wire", "transport", "job interface", "common", "shared", "protocol folders"})),
}

#: harness/: the same, bottom to top.
HARNESS_LAYERS: dict[str, tuple[frozenset[str], frozenset[str]]] = {
    "assets": (frozenset({"harness.assets"}), frozenset()),  # where shipped files are; every layer may ask
    "profiles": (frozenset({"harness.profiles"}), frozenset()),
    "shaping": (frozenset({"harness.shaping"}), frozenset({"profiles"})),
    "cluster": (frozenset({"harness.cluster"}), frozenset({"profiles", "shaping"})),
    "calibration": (frozenset({"harness.calibration"}), frozenset({"profiles", "shaping", "cluster"})),
    "trace": (frozenset({"harness.trace", "harness.progress"}), frozenset()),
    "checks": (frozenset({"harness.checks"}), frozenset({"trace"})),
    "timeline": (frozenset({"harness.timeline"}), frozenset({"profiles", "trace"})),
    "matrix": (frozenset({"harness.matrix"}), frozenset({"profiles"})),
    "report": (frozenset({"harness.report", "harness.report_compare", "harness.report_network",
                          "harness.report_plots", "harness.report_reproduce", "harness.provenance"}),
               frozenset({"checks", "trace", "profiles"})),
    "experiment": (frozenset({"harness.experiment"}),
                   frozenset({"profiles", "shaping", "cluster", "trace", "timeline", "protocol entry"})),
    "claims": (frozenset({"harness.claims", "harness.claimkinds", "harness.runner", "harness.fidelity"}),
               frozenset({"checks", "trace", "report", "matrix", "experiment", "calibration", "protocol entry"})),
    "front": (frozenset({"harness.cli", "harness.cli_calibrate", "harness.cli_profiles", "harness.cli_protocols",
                         "harness.cli_run", "harness.cli_doctor", "harness.cli_kube", "harness.demo",
                         "harness.pytest_plugin"}),
              frozenset({"profiles", "shaping", "cluster", "calibration", "trace", "checks", "timeline", "matrix",
                         "report", "experiment", "claims", "front", "protocol entry", "protocol common"})),
}
#: What the harness may use of protocols/: the catalog (names, declarations) and the common
#: layer's plain data (the device model). Everything else runs inside the containers.
HARNESS_SEES = {"protocols.catalog": "protocol entry", "protocols.job": "protocol entry",
               "protocols.common": "protocol common"}


def protocol_folders() -> frozenset[str]:
    """Every direct subpackage of protocols/ that declares protocols."""
    return frozenset(f"protocols.{p.parent.name}" for p in (REPO / "protocols").glob(f"*/{DECLARATION_MODULE}.py"))


def unit_of(module: str) -> str:
    """``protocols.gossip.mix`` -> ``protocols.gossip``; ``harness.trace`` -> ``harness.trace``."""
    return ".".join(module.split(".")[:2])


def module_of(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def imports(path: Path) -> Iterator[tuple[int, str]]:
    """(line, absolute module) for every import in ``path``, also inside functions."""
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            yield from ((node.lineno, alias.name) for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            if node.module in ("protocols", "harness"):  # from harness import shaping
                yield from ((node.lineno, f"{node.module}.{alias.name}") for alias in node.names)
            else:
                yield node.lineno, node.module


def layer_table(side: str) -> tuple[dict[str, str], dict[str, frozenset[str]]]:
    """unit -> its layer, and layer -> the layers it may import (its own included)."""
    layers = dict(PROTOCOL_LAYERS if side == "protocols" else HARNESS_LAYERS)
    if side == "protocols":
        layers["protocol folders"] = (protocol_folders(), layers["protocol folders"][1])
    placed = {unit: name for name, (units, _) in layers.items() for unit in units}
    if side == "harness":
        placed.update(HARNESS_SEES)
    # A layer may import itself, except protocol folders: each stands alone (see the test below).
    allowed = {name: allowed | ({name} if name != "protocol folders" else set())
               for name, (_, allowed) in layers.items()}
    if side == "harness":  # the asset locator (stdlib only) sits under every layer
        allowed = {name: allowed[name] | {"assets"} for name in allowed}
    return placed, allowed


def violations(side: str) -> list[str]:
    placed, allowed = layer_table(side)
    found: list[str] = []
    for path in sorted((REPO / side).rglob("*.py")):
        unit = unit_of(module_of(path))
        if unit == side:  # the package's own __init__: a docstring, nothing to import
            found += [f"{path.relative_to(REPO)}:{line}: the root package imports {m}" for line, m in imports(path)]
            continue
        if unit not in placed:
            found.append(f"{path.relative_to(REPO)}: unit {unit} is in no layer of {side}/ (add it to the table "
                         "here and to docs/architecture.md)")
            continue
        layer = placed[unit]
        for line, module in imports(path):
            top = module.split(".")[0]
            where = f"{path.relative_to(REPO)}:{line}"
            if top in CONFINED and unit not in CONFINED[top]:
                found.append(f"{where}: {unit} imports {top}, which only {CONFINED[top]} may")
            if side == "protocols" and top == "harness":
                found.append(f"{where}: protocols/ imports the harness ({module})")
            if top not in ("protocols", "harness") or unit_of(module) == unit:
                continue
            target = placed.get(unit_of(module))
            if target is None:
                found.append(f"{where}: {unit} ({layer}) imports {module}, which the {side}/ layers do not offer")
            elif target not in allowed[layer]:
                found.append(f"{where}: {unit} ({layer}) imports {module} ({target}); {layer} may import "
                             f"{sorted(allowed[layer] - {layer})}")
    return found


@pytest.mark.parametrize("side", ["protocols", "harness"])
def test_every_import_goes_down_the_layers(side: str) -> None:
    assert violations(side) == []


def test_protocol_folders_do_not_import_each_other() -> None:
    """Spelled out, because it is the rule adding a protocol relies on: a folder can be removed alone."""
    folders = protocol_folders()
    assert {"protocols.allreduce", "protocols.moshpit", "protocols.swarm", "protocols.matcha"} <= folders
    crossing = [
        f"{path.relative_to(REPO)}:{line} imports {module}"
        for folder in folders
        for path in (REPO / Path(*folder.split("."))).rglob("*.py")
        for line, module in imports(path)
        if unit_of(module) in folders - {folder}
    ]
    assert crossing == []


def test_the_checker_sees_a_crossing(tmp_path: Path) -> None:
    """The walk finds imports inside functions too, so a lazy import cannot hide a crossing."""
    source = tmp_path / "m.py"
    source.write_text("def f():\n    from protocols.moshpit.sgd import MoshpitSGD\n    import docker\n")
    assert list(imports(source)) == [(2, "protocols.moshpit.sgd"), (3, "docker")]
