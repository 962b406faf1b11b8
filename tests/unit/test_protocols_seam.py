"""The protocol seam: a protocol's name is spelled in its own folder only, and a protocol is one folder.

The rule: the literal name of a protocol (``"moshpit"``, ``"swarm"``, ``"matcha"`` ...), or of a
job a protocol folder declares (``"moshpit_average"``), is a string constant in no Python file
under ``squall/`` or ``benchmarks/`` outside the folder that declares it. Other
code imports the folder's constant (``from squall.protocols.moshpit.protocol import NAME``) or asks the
catalog. Tests, ``claims.yaml`` and ``matrices/`` name protocols freely: they are the users.

Names that are also ordinary words of another vocabulary cannot be told apart by looking at a
string, so they are not checked; :data:`GENERIC` lists each with the other meaning, and a test
proves that other meaning exists. Algorithm names (``"allreduce"``) are a separate vocabulary of
the shared ``train`` job and are not checked either; where one equals a protocol name it is
checked as that name.
"""

from __future__ import annotations

import ast
import sys
import textwrap
from collections.abc import Iterable, Iterator
from pathlib import Path

import pytest
import torch.distributed

from squall.bench.allreduce import CHECKS
from squall.gossip.graphs import TOPOLOGIES
from squall.protocols.allreduce.sgd import COLLECTIVES
from squall.protocols.catalog import scan
from squall.training.declaration import Declaration, JobDeclaration

REPO = Path(__file__).resolve().parents[2]
CHECKED_ROOTS = ("squall", "benchmarks")

#: Declared names that are also words of another vocabulary, and that other meaning.
GENERIC: dict[str, str] = {
    "ring": "a gossip topology (squall.gossip.graphs.TOPOLOGIES, swarm's graphs) and a collective "
            "(squall.protocols.allreduce.COLLECTIVES, the collectives' benchmark)",
    "butterfly": "a collective (squall.protocols.allreduce.COLLECTIVES, the collectives' benchmark)",
    "gloo": "torch.distributed's backend name (init_process_group('gloo'), the benchmarks' contender)",
    "ps": "the parameter-server step in the collectives' exactness check (squall.bench.allreduce.CHECKS)",
}

#: (file, name) pairs that break the rule today, and why they may.
ALLOWED: dict[tuple[str, str], str] = {
    ("squall/training/algorithms/reduce.py", "local_sgd"): "LocalSGD is shared (our collectives and gloo reduce "
    "with it), so it lives in the common layer; its algorithm name is the one the local_sgd protocol shares",
    ("squall/cli/main.py", "demo"): "the `squall demo` subcommand (the default experiment), older than the "
    "DeMo protocol and unrelated to it",
}


def owners() -> dict[str, Path]:
    """Each declared protocol and protocol job name -> the folder that declares it."""
    out: dict[str, Path] = {}
    for source, declarations in scan("squall.protocols"):
        folder = Path(*source.split(".")[:-1])
        for d in declarations:
            if isinstance(d, Declaration | JobDeclaration):
                assert out.get(d.name, folder) == folder, f"{d.name!r} declared by {out[d.name]} and {folder}"
                out[d.name] = folder
    return out


def string_constants(path: Path) -> Iterator[tuple[int, str]]:
    """(line, value) of every str constant in the file."""
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            yield node.lineno, node.value


def test_generic_names_have_their_other_meaning() -> None:
    declared = owners()
    assert set(GENERIC) <= set(declared), "a GENERIC entry names no protocol: remove it"
    other = {*TOPOLOGIES, *COLLECTIVES, *CHECKS, torch.distributed.Backend.GLOO}
    assert set(GENERIC) <= other, f"not a word of another vocabulary: {sorted(set(GENERIC) - other)}"


def violations(files: Iterable[tuple[Path, Path]], checked: dict[str, Path]) -> list[str]:
    """``file:line: message`` for each checked name spelled outside its folder; ``files`` are (relative, real)."""
    out = []
    for rel, path in files:
        for line, value in string_constants(path):
            folder = checked.get(value)
            if folder is None or rel.is_relative_to(folder) or (rel.as_posix(), value) in ALLOWED:
                continue
            out.append(f"{rel}:{line}: {value!r} belongs to {folder}/ (import its constant there)")
    return out


def checked_names() -> dict[str, Path]:
    """The names the rule checks, with their folders (see GENERIC)."""
    return {name: folder for name, folder in owners().items() if name not in GENERIC}


def test_protocol_names_are_spelled_only_in_their_own_folder() -> None:
    checked = checked_names()
    assert {"moshpit", "swarm", "matcha", "dpsgd", "sgp", "local_sgd", "moshpit_average", "gloo_train"} <= set(checked)
    files = [(path.relative_to(REPO), path) for root in CHECKED_ROOTS for path in sorted((REPO / root).rglob("*.py"))]
    assert len(files) > 100
    found = violations(files, checked)
    assert not found, "protocol names spelled outside their folder:\n" + "\n".join(found)


def test_the_check_sees_a_misplaced_name_and_spares_its_own_folder(tmp_path: Path) -> None:
    code = tmp_path / "code.py"
    code.write_text('"""Doc."""\nPROTOCOL = "moshpit"\nTOPOLOGY = "ring"\nJOB = {"entry": "moshpit_average"}\n')
    checked = checked_names()
    assert violations([(Path("squall/report/x.py"), code)], checked) == [
        "squall/report/x.py:2: 'moshpit' belongs to squall/protocols/moshpit/ (import its constant there)",
        "squall/report/x.py:4: 'moshpit_average' belongs to squall/protocols/moshpit/ (import its constant there)",
    ]
    assert violations([(Path("squall/protocols/moshpit/x.py"), code)], checked) == []
    found = violations([(Path("squall/protocols/swarm/x.py"), code)], checked)
    assert found[0].startswith("squall/protocols/swarm/x.py:2:")


# -- adding a protocol is one folder -----------------------------------------------------------------

FOLDER_PROTOCOL = textwrap.dedent('''
    """A toy protocol: everything Squall needs to know about it, in one module."""

    from typing import Any

    from squall.training.algorithms.base import LocalOnly
    from squall.training.declaration import AlgorithmDeclaration, Declaration, JobDeclaration


    def build(transport: Any, sgd: Any, options: dict[str, Any]) -> LocalOnly:
        algorithm = LocalOnly(optimizer=sgd)
        algorithm.name = "toy_" + str(options.pop("flavour", "plain"))
        return algorithm


    DECLARATIONS = (
        AlgorithmDeclaration("toy", build),  # no options class: the builder pops from a dict
        JobDeclaration("toy_job", "{package}.toy.jobs:main"),
        Declaration("toy", "a toy protocol in one folder", "train", {{"algorithm": "toy"}},
                    paper="Nobody, Nowhere 2026", needs=frozenset({{"tcp"}})),
        Declaration("toy_job_protocol", "the toy through its own job", "toy_job", rejoins=True),
    )
''')
FOLDER_JOBS = 'def main(ctx):\n    return {"toy": True}\n'


def write_folder(root: Path, package: str) -> None:
    """``<root>/<package>/toy/{__init__,protocol,jobs}.py``: a package holding one protocol folder."""
    toy = root / package / "toy"
    toy.mkdir(parents=True)
    (root / package / "__init__.py").write_text("")
    (toy / "__init__.py").write_text("")
    (toy / "protocol.py").write_text(FOLDER_PROTOCOL.format(package=package))
    (toy / "jobs.py").write_text(FOLDER_JOBS)


@pytest.fixture
def fresh_catalog() -> Iterator[None]:
    """The catalog is read again by the test, and again after it (its cache holds no test's view)."""
    from squall.protocols.catalog import discover

    discover.cache_clear()
    yield
    discover.cache_clear()


def test_a_protocols_style_scan_finds_a_new_folder(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write_folder(tmp_path, "seam_scan_pkg")
    monkeypatch.syspath_prepend(str(tmp_path))
    [(source, declarations)] = scan("seam_scan_pkg")
    assert source == "seam_scan_pkg.toy.protocol"
    assert sorted(d.name for d in declarations) == ["toy", "toy", "toy_job", "toy_job_protocol"]


def test_one_folder_through_the_entry_point_group_reaches_catalog_registry_and_train(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, fresh_catalog: None
) -> None:
    import importlib.metadata

    from squall.protocols.catalog import lookup, make_algorithm, source_of
    from squall.transport import inproc_mesh
    from squall.worker.registry import resolve

    write_folder(tmp_path, "seam_ep_pkg")
    monkeypatch.syspath_prepend(str(tmp_path))
    point = importlib.metadata.EntryPoint("toy", "seam_ep_pkg.toy.protocol", "squall.protocols")
    real = importlib.metadata.entry_points
    monkeypatch.setattr(importlib.metadata, "entry_points",
                        lambda **kw: [point] if kw == {"group": "squall.protocols"} else real(**kw))

    toy = lookup("toy")
    assert (toy.entry, dict(toy.config), toy.paper, toy.needs) == (
        "train", {"algorithm": "toy"}, "Nobody, Nowhere 2026", frozenset({"tcp"}))
    assert lookup("toy_job_protocol").rejoins
    assert source_of("toy") == "entry point toy = 'seam_ep_pkg.toy.protocol'"
    assert lookup("moshpit").entry == "moshpit"  # the shipped ones are still there
    assert make_algorithm("toy", inproc_mesh(2)[0], options={"flavour": "sour"}).name == "toy_sour"
    assert resolve("toy_job")(None) == {"toy": True}
    assert "seam_ep_pkg" in sys.modules
