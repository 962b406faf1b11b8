"""constraints.txt pins every dependency pyproject.toml names, inside pyproject's ranges, and the
worker image's pins (containers/requirements.txt) are the same versions, so the host that plans
and checks a run and the workers that execute it compute with the same numpy and torch."""

from __future__ import annotations

import tomllib
from pathlib import Path

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name
from packaging.version import Version

REPO = Path(__file__).resolve().parents[2]


def _pins(path: Path) -> dict[str, Version]:
    pins: dict[str, Version] = {}
    for number, raw in enumerate(path.read_text().splitlines(), 1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        req = Requirement(line)
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==", f"{path.name}:{number}: {line!r} is not an exact pin"
        name = canonicalize_name(req.name)
        assert name not in pins, f"{path.name}:{number}: {req.name} pinned twice"
        pins[name] = Version(specs[0].version)
    return pins


def _declared() -> list[Requirement]:
    project = tomllib.loads((REPO / "pyproject.toml").read_text())["project"]
    return [Requirement(r) for r in [*project["dependencies"], *project["optional-dependencies"]["dev"]]]


def test_every_declared_dependency_is_pinned_inside_its_range() -> None:
    pins = _pins(REPO / "constraints.txt")
    for req in _declared():
        name = canonicalize_name(req.name)
        assert name in pins, f"constraints.txt has no pin for {req.name} (pyproject.toml needs {req})"
        assert req.specifier.contains(pins[name], prereleases=True), (
            f"constraints.txt pins {req.name}=={pins[name]}, outside pyproject.toml's {req.specifier}")


def test_the_worker_image_runs_the_host_versions() -> None:
    host, image = _pins(REPO / "constraints.txt"), _pins(REPO / "containers" / "requirements.txt")
    for name, version in image.items():  # the image's torch carries its build's label (+cpu): same release
        assert host.get(name) in (version, Version(version.public)), (
            f"containers/requirements.txt pins {name}=={version}, constraints.txt {host.get(name)}")
