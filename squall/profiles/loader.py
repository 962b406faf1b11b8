"""Reading profiles: YAML text -> Profile, names -> files, and the list of available profiles.

A bare name (``wan-5ms``) is looked up as ``NAME.yaml`` (or ``.yml``) in the directories of
``SQUALL_PROFILE_PATH`` (``os.pathsep``-separated, searched first, so they can shadow shipped
profiles) and then in the shipped ``netem_profiles/`` (package data of an installed Squall, the
checkout's folder otherwise: :mod:`squall.assets`). Anything with a path separator or a YAML
suffix is read as a path.
"""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Final

from squall.assets import profiles_dir
from squall.profiles.churn import ChurnPlan, parse_churn
from squall.profiles.devices import DeviceModel, parse_devices
from squall.profiles.errors import ROOT_KEY, Origin, ProfileError, Section, expect_list
from squall.profiles.links import LinkRules, parse_links
from squall.profiles.profile import Phase, Profile
from squall.profiles.regions import RegionSet, parse_regions
from squall.profiles.safe_yaml import MAX_FILE_BYTES, read_yaml
from squall.profiles.units import parse_duration_us, parse_int

logger = logging.getLogger(__name__)

PROFILE_DIR: Final = profiles_dir()
PATH_ENV: Final = "SQUALL_PROFILE_PATH"
TOP_KEYS: Final = ("name", "description", "min_workers", "regions", "links", "phases", "churn", "devices")
_NAME: Final = re.compile(r"^[a-z0-9][a-z0-9._-]*$")
MAX_NAME_CHARS: Final = 64  # names become file names, test ids and report headings
NAME_ALLOWED: Final = (
    f"up to {MAX_NAME_CHARS} lower-case letters, digits, '.', '_' and '-' (e.g. wan-50ms-100mbit)"
)


@dataclass(frozen=True)
class ProfileInfo:
    """One available profile, for listings."""

    name: str  # what load_profile accepts
    path: Path  # the file
    description: str  # first line of its description (or why it could not be read)


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
            parse_links(entry.at("links"), section.value("links"), regions, in_phase=True)
            if section.has("links") else None
        )
        phases.append(Phase(entry, at_us, name, links or LinkRules(entry.at("links"))))
    return tuple(phases)


def _text(
    section: Section, key: str, pattern: re.Pattern[str] | None, allowed: str, max_chars: int | None = None
) -> str:
    """A required string key: missing, not a string, empty and badly spelt are told apart."""
    origin = section.origin.at(key)
    if not section.has(key):
        raise origin.error("is required", allowed=allowed)
    value = section.value(key)
    if not isinstance(value, str):
        raise origin.error("must be a string", value=value, allowed=allowed)
    if not value.strip():
        raise origin.error("must not be empty", value=value, allowed=allowed)
    if max_chars is not None and len(value.strip()) > max_chars:
        raise origin.error(f"is {len(value.strip())} characters long", value=value, allowed=allowed)
    if pattern and not pattern.match(value):
        raise origin.error("has characters that are not allowed", value=value, allowed=allowed)
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
        name=_text(section, "name", _NAME, NAME_ALLOWED, MAX_NAME_CHARS),
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


def parse_profile(text: str | bytes, source: str = "<string>") -> Profile:
    """Build a Profile from YAML text (bytes must be UTF-8); raises ProfileError for anything refused.

    The YAML is checked before it is built (size, nodes after alias expansion, depth, tags,
    duplicated keys: see :mod:`squall.profiles.safe_yaml`).
    """
    return profile_from_data(read_yaml(text, source), source)


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
    profile = parse_profile(_read_bytes(path), str(path))
    if profile.name != path.stem:
        logger.warning("%s: name %r differs from the file name %r", path, profile.name, path.stem)
    return profile


def _read_bytes(path: Path) -> bytes:
    """The file's bytes; refused from its size alone when it is too long to be a profile."""
    try:
        size = path.stat().st_size
        if size > MAX_FILE_BYTES:
            raise ProfileError(str(path), ROOT_KEY, f"the file is {size} bytes long",
                               allowed=f"at most {MAX_FILE_BYTES} bytes ({MAX_FILE_BYTES >> 10} KiB)")
        with path.open("rb") as handle:
            return handle.read(MAX_FILE_BYTES + 1)  # a file that grew since stat() is caught by read_yaml
    except OSError as exc:
        raise ProfileError(str(path), ROOT_KEY, f"cannot read the file: {exc.strerror or exc}") from None


def _describe(path: Path) -> str:
    """The first line of a profile's description, without a full check (listings must not fail)."""
    try:
        data = read_yaml(_read_bytes(path), str(path))
    except ProfileError as exc:
        return f"(unreadable: {exc.problem})"
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
