"""No import circles in ``squall/``: the module-level import graph has no cycle.

Edges are the imports a module runs when it is imported: its top-level statements, including
those under ``if``/``try`` at module level, but not imports inside functions or classes' methods
(they run later, on a call) and not those under ``if TYPE_CHECKING:`` (they never run). An import
of a package counts as an edge to its ``__init__``; ``from package import name`` is an edge to the
submodule ``package.name`` when there is one, else to the package. Relative imports are resolved.
(A package's ``__init__``, which Python runs before any of its submodules, is not an edge of
them: a package that imports its own submodules is no circle.) A cycle fails the test with the
modules along it.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ROOT = REPO / "squall"


def module_of(path: Path) -> str:
    rel = path.relative_to(REPO).with_suffix("")
    parts = rel.parts[:-1] if rel.name == "__init__" else rel.parts
    return ".".join(parts)


def _is_type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def module_level(body: list[ast.stmt]) -> Iterator[ast.Import | ast.ImportFrom]:
    """The import statements that run when the module runs: not in a def, nor under ``if TYPE_CHECKING:``."""
    for node in body:
        if isinstance(node, ast.Import | ast.ImportFrom):
            yield node
        elif isinstance(node, ast.If):
            if not _is_type_checking(node.test):
                yield from module_level(node.body)
            yield from module_level(node.orelse)
        elif isinstance(node, ast.Try):
            for block in (node.body, node.orelse, node.finalbody, *(h.body for h in node.handlers)):
                yield from module_level(block)
        elif isinstance(node, ast.With):
            yield from module_level(node.body)
        elif isinstance(node, ast.ClassDef):
            yield from module_level(node.body)  # a class body runs at import; its methods do not


def _absolute(here: str, is_package: bool, node: ast.ImportFrom) -> str:
    if node.level == 0:
        return node.module or ""
    parts = here.split(".") if is_package else here.split(".")[:-1]
    base = parts[: len(parts) - (node.level - 1)]
    return ".".join(base + ([node.module] if node.module else []))


def graph() -> dict[str, set[str]]:
    """Module -> the ``squall`` modules its import runs."""
    paths = sorted(ROOT.rglob("*.py"))
    known = {module_of(p) for p in paths}
    edges: dict[str, set[str]] = {}
    for path in paths:
        here = module_of(path)
        targets: set[str] = set()
        for node in module_level(ast.parse(path.read_text(), str(path)).body):
            if isinstance(node, ast.Import):
                targets |= {alias.name for alias in node.names}
                continue
            module = _absolute(here, path.name == "__init__.py", node)
            subs = {f"{module}.{alias.name}" for alias in node.names} & known
            targets |= subs or {module}
        edges[here] = {t for t in targets if t in known and t != here}
    return edges


def find_cycle(edges: dict[str, set[str]]) -> list[str] | None:
    """One cycle as a list of modules (the first repeated at the end), or None."""
    state: dict[str, int] = {}  # 1: on the current path, 2: done
    stack: list[str] = []

    def visit(node: str) -> list[str] | None:
        state[node] = 1
        stack.append(node)
        for nxt in sorted(edges.get(node, ())):
            if state.get(nxt) == 1:
                return [*stack[stack.index(nxt):], nxt]
            if nxt not in state:
                found = visit(nxt)
                if found:
                    return found
        stack.pop()
        state[node] = 2
        return None

    for start in sorted(edges):
        if start not in state:
            found = visit(start)
            if found:
                return found
    return None


def test_squall_has_no_import_cycle() -> None:
    cycle = find_cycle(graph())
    assert cycle is None, "import cycle: " + " -> ".join(cycle or [])


def test_the_checker_finds_a_cycle_and_skips_lazy_and_type_only_imports(tmp_path: Path) -> None:
    source = ("from typing import TYPE_CHECKING\nimport squall.b\nif TYPE_CHECKING:\n    import squall.c\n"
              "def f():\n    import squall.d\n")
    tree = ast.parse(source)
    assert [n.names[0].name for n in module_level(tree.body) if isinstance(n, ast.Import)] == ["squall.b"]
    assert find_cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}}) == ["a", "b", "c", "a"]
    assert find_cycle({"a": {"b", "c"}, "b": {"c"}, "c": set()}) is None
