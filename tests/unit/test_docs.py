"""The docs point inside the repository: every relative link resolves, and no file cites one outside it.

A reader of a checkout (or of the wheel's sdist) has nothing but the repository, so a Markdown link
to a file that is not there, or a reference to notes that live elsewhere, is a dead end.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

#: Documents kept outside the repository that its files once cited (spelled in pieces, so that this
#: file does not cite them either and needs no exception in the check).
OUTSIDE = (*(f"{name}.md" for name in ("PROTOCOLS", "DESIGN", "LOW-COMMUNICATION", "STYLE")), "../" + "shared/")
#: ``[text](target)``; the target up to a closing parenthesis or a space.
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")
README_MAX_LINES = 160


def tracked(*patterns: str) -> list[Path]:
    out = subprocess.run(["git", "ls-files", *patterns], cwd=REPO, capture_output=True, text=True, check=True)
    return [REPO / line for line in out.stdout.splitlines() if line]


def markdown() -> list[Path]:
    return [p for p in tracked("*.md") if p.is_file()]


def broken_links(path: Path) -> list[str]:
    """``target`` of each relative link in ``path`` whose file does not exist (anchors and URLs skipped)."""
    found = []
    for target in LINK.findall(path.read_text()):
        if "://" in target or target.startswith(("#", "mailto:")):
            continue
        file = target.split("#", 1)[0]
        if file and not (path.parent / file).exists():
            found.append(target)
    return found


@pytest.mark.parametrize("path", markdown(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(path: Path) -> None:
    assert broken_links(path) == []


def test_no_file_cites_notes_outside_the_repository() -> None:
    hits = []
    for path in tracked():
        if not path.is_file():
            continue
        try:
            text = path.read_text()
        except UnicodeDecodeError:
            continue
        hits += [f"{path.relative_to(REPO)}: {name}" for name in OUTSIDE if name in text]
    assert hits == []


def test_the_readme_is_a_first_page() -> None:
    lines = (REPO / "README.md").read_text().splitlines()
    assert len(lines) <= README_MAX_LINES, f"README.md has {len(lines)} lines; docs/ is for the rest"


def test_the_checker_sees_a_broken_link(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    (tmp_path / "there.md").write_text("x")
    page.write_text("[ok](there.md) [anchor](#x) [web](https://example.org) [gone](missing.md#part)")
    assert broken_links(page) == ["missing.md#part"]
