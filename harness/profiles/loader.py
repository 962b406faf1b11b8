"""Reading profiles: YAML text -> Profile, names -> files, and the list of available profiles.

A bare name (``wan-5ms``) is looked up as ``NAME.yaml`` (or ``.yml``) in the directories of
``SQUALL_PROFILE_PATH`` (``os.pathsep``-separated, searched first, so they can shadow shipped
profiles) and then in the repository's ``netem_profiles/``. Anything with a path separator or a
YAML suffix is read as a path.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import yaml

from harness.profiles.churn import ChurnPlan, parse_churn
from harness.profiles.devices import DeviceModel, parse_devices
from harness.profiles.errors import ROOT_KEY, Origin, ProfileError, Section, expect_list
from harness.profiles.links import LinkRules, parse_links
from harness.profiles.profile import Phase, Profile
from harness.profiles.regions import RegionSet, parse_regions
from harness.profiles.units import parse_duration_us, parse_int

logger = logging.getLogger(__name__)

PROFILE_DIR: Final = Path(__file__).resolve().parents[2] / "netem_profiles"
PATH_ENV: Final = "SQUALL_PROFILE_PATH"
TOP_KEYS: Final = ("name", "description", "min_workers", "regions", "links", "phases", "churn", "devices")
_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
NAME_ALLOWED: Final = "lower-case letters, digits, '.', '_' and '-' (e.g. wan-50ms-100mbit)"


@dataclass(frozen=True)
class ProfileInfo:
    """One available profile, for listings."""

    name: str  # what load_profile accepts
    path: Path  # the file
    description: str  # first line of its description (or why it could not be read)


class _StrictLoader(yaml.SafeLoader):
    """A SafeLoader that rejects duplicated mapping keys instead of keeping the last one."""


def _construct_mapping(loader: _StrictLoader, node: yaml.MappingNode) -> dict[object, object]:
    loader.flatten_mapping(node)
    seen: set[object] = set()
    for key_node, _ in node.value:
        key = loader.construct_object(key_node, deep=True)
        if not isinstance(key, str | int | float | bool) or key in seen:
            raise yaml.constructor.ConstructorError(
                None, None, f"duplicated or unusable key {key!r}", key_node.start_mark
            )
        seen.add(key)
    return dict(loader.construct_pairs(node, deep=True))


_StrictLoader.add_constructor(yaml.resolver.BaseResolver.DEFAULT_MAPPING_TAG, _construct_mapping)


def _read_yaml(text: str, source: str) -> object:
    """Parse YAML text, turning YAML errors into ProfileErrors."""
    try:
        return yaml.load(text, Loader=_StrictLoader)  # a SafeLoader subclass
    except yaml.YAMLError as exc:
        raise ProfileError(source, "(yaml)", f"not valid YAML: {' '.join(str(exc).split())}") from None


def _phases(origin: Origin, raw: object, regions: RegionSet) -> tuple[Phase, ...]:
    """Read ``phases: [{at: 30s, name: ..., links: {...}}, ...]`` in increasing time order."""
    phases: list[Phase] = []
    for index, item in enumerate(expect_list(origin, raw, "{at: TIME, links: {...}} entries")):
        entry = origin.at(index)
        section = Section(entry, item, ("at", "name", "links"))
        at_us = section.require("at", parse_duration_us, "a time >= 0 such as 30s")
        if phases and at_us <= phases[-1].at_us:
            raise entry.at("at").error(
                "phases must be in increasing time order",
                value=section.value("at"),
                allowed=f"a time after {phases[-1].origin.at('at').key} ({phases[-1].at_s:g}s)",
            )
        name = section.value("name") if section.has("name") else ""
        if not isinstance(name, str):
            raise entry.at("name").error("must be a string", value=name)
        links = (
            parse_links(entry.at("links"), section.value("links"), regions) if section.has("links") else None
        )
        phases.append(Phase(entry, at_us, name, links or LinkRules(entry.at("links"))))
    return tuple(phases)


def _text(section: Section, key: str, pattern: re.Pattern[str] | None, allowed: str) -> str:
    """A required string key."""
    value = section.value(key) if section.has(key) else None
    if not isinstance(value, str) or not value.strip() or (pattern and not pattern.match(value)):
        raise section.origin.at(key).error(
            "is required and must be a non-empty string", value=value, allowed=allowed
        )
    return value.strip()


def profile_from_data(raw: object, source: str = "<string>") -> Profile:
    """Build and check a Profile from parsed YAML; raises ProfileError, never returns half a profile."""
    root = Origin(source, ROOT_KEY)
    if raw is None:
        raise root.error("the file is empty", allowed=f"a mapping with keys {', '.join(TOP_KEYS)}")
    section = Section(root, raw, TOP_KEYS)
    regions = parse_regions(root.at("regions"), section.value("regions")) if section.has("regions") else None
    regions = regions or RegionSet(root.at("regions"))
    profile = Profile(
        name=_text(section, "name", _NAME, NAME_ALLOWED),
        description=_text(section, "description", None, "one line saying what the profile emulates"),
        source=source,
        min_workers=section.get("min_workers", lambda v: parse_int(v, 1)) or 1,
        regions=regions,
        base=parse_links(root.at("links"), section.value("links"), regions)
        if section.has("links")
        else LinkRules(root.at("links")),
        phases=_phases(root.at("phases"), section.value("phases"), regions) if section.has("phases") else (),
        churn=parse_churn(root.at("churn"), section.value("churn"))
        if section.has("churn")
        else ChurnPlan(root),
        devices=parse_devices(root.at("devices"), section.value("devices"))
        if section.has("devices")
        else DeviceModel(root.at("devices")),
    )
    profile.validate_for(profile.required_workers())
    return profile


def parse_profile(text: str, source: str = "<string>") -> Profile:
    """Build a Profile from YAML text."""
    return profile_from_data(_read_yaml(text, source), source)


def profile_dirs() -> list[Path]:
    """Where bare names are looked up, in order."""
    extra = [Path(part) for part in os.environ.get(PATH_ENV, "").split(os.pathsep) if part]
    return [*extra, PROFILE_DIR]


def find_profile(name_or_path: str | os.PathLike[str]) -> Path:
    """The file a name or path refers to; a ProfileError lists the known names when there is none."""
    text = os.fspath(name_or_path)
    looks_like_path = os.sep in text or "/" in text or text.endswith((".yaml", ".yml"))
    if looks_like_path or isinstance(name_or_path, os.PathLike):
        path = Path(text)
        if not path.is_file():
            raise ProfileError(text, ROOT_KEY, "no such file")
        return path
    for directory in profile_dirs():
        for suffix in (".yaml", ".yml"):
            if (directory / f"{text}{suffix}").is_file():
                return directory / f"{text}{suffix}"
    known = ", ".join(info.name for info in list_profiles()) or "none"
    dirs = ", ".join(str(d) for d in profile_dirs())
    raise ProfileError(text, ROOT_KEY, f"no profile of this name in {dirs}", allowed=known)


def load_profile(name_or_path: str | os.PathLike[str]) -> Profile:
    """Load a profile by bare name (``wan-5ms``) or by path; raises ProfileError."""
    path = find_profile(name_or_path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ProfileError(str(path), ROOT_KEY, f"cannot read the file: {exc}") from None
    profile = parse_profile(text, str(path))
    if profile.name != path.stem:
        logger.warning("%s: name %r differs from the file name %r", path, profile.name, path.stem)
    return profile


def _describe(path: Path) -> str:
    """The first line of a profile's description, without a full check (listings must not fail)."""
    try:
        data = yaml.safe_load(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        return f"(unreadable: {type(exc).__name__})"
    description = data.get("description") if isinstance(data, dict) else None
    return description.strip().splitlines()[0] if isinstance(description, str) and description.strip() else ""


def list_profiles() -> list[ProfileInfo]:
    """Every profile reachable by bare name, sorted by name; earlier directories shadow later ones."""
    found: dict[str, ProfileInfo] = {}
    for directory in profile_dirs():
        if not directory.is_dir():
            continue
        for path in sorted([*directory.glob("*.yaml"), *directory.glob("*.yml")]):
            if path.stem not in found:
                found[path.stem] = ProfileInfo(path.stem, path, _describe(path))
    return [found[name] for name in sorted(found)]
