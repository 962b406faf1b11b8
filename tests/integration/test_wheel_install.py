"""The wheel ``make wheel`` builds: one top-level package, Squall's assets as package data, nothing
downloaded, small. Built from a copy of the working tree's tracked and new files (what a clean
checkout holds), with the Makefile's own command.

Installing Squall into a fresh virtualenv and running a third party's protocol through the plugin is
docs/ci.md's job, run by tests/integration/test_ci_recipe.py (from a clone: pip builds the same wheel).
"""

from __future__ import annotations

import re
import shlex
import subprocess
import sys
import zipfile
from pathlib import Path

from squall import assets

from .source_copy import source_copy

REPO = Path(__file__).resolve().parents[2]


def _makefile_wheel_command() -> list[str]:
    """The ``pip wheel`` line of the Makefile's ``wheel`` target, as words (``$(PY)`` is this interpreter)."""
    text = (REPO / "Makefile").read_text()
    target = text.split("\nwheel:", 1)[1].split("\n\n", 1)[0]
    line = next(x for x in target.splitlines() if "pip wheel" in x)
    words = shlex.split(re.sub(r"^\s*@", "", line).replace("$(PY)", sys.executable))
    assert words[-1] == "." and "-w" in words, words
    return words


def test_make_wheel_builds_one_package_with_its_assets(tmp_path: Path) -> None:
    src = source_copy(tmp_path / "src")
    command = _makefile_wheel_command()
    proc = subprocess.run(command, cwd=src, capture_output=True, text=True, timeout=600, check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (wheel,) = (src / "dist").glob("squall-*.whl")
    assert wheel.name == "squall-0.1.0-py3-none-any.whl"  # the name docs/install.md gives
    with zipfile.ZipFile(wheel) as archive:
        names = set(archive.namelist())
    # One namespace: everything the wheel installs is the squall package or its metadata.
    tops = {n.split("/", 1)[0] for n in names}
    assert {t for t in tops if not t.endswith(".dist-info")} == {"squall"}, sorted(tops)
    packaged = f"squall/{assets.PACKAGED_DIR}"
    for needed in ("netem_profiles/lan.yaml", "netem_profiles/README.md", "containers/worker.Dockerfile",
                   "containers/requirements.txt", "containers/base/debootstrap.sh", "claims.yaml",
                   "matrices/ci.yaml"):
        assert f"{packaged}/{needed}" in names, needed
    shipped = {p.name for p in (REPO / "netem_profiles").glob("*.yaml")}
    assert {n.rsplit("/", 1)[1] for n in names if n.startswith(f"{packaged}/netem_profiles/")} >= shipped
    assert not [n for n in names if ".wheelhouse" in n or n.endswith(".whl")]  # no downloaded wheels
    assert wheel.stat().st_size < 5 * 2**20, wheel.stat().st_size  # "under 5 MB" (docs/install.md)
    with zipfile.ZipFile(wheel) as archive:
        entry_points = next(archive.read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "squall = squall.cli.main:main" in entry_points and "squall = squall.pytest_plugin" in entry_points
