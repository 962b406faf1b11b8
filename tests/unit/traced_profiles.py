"""Which shipped profiles give a link scope a ``trace:`` (issue 29), and the mark their loading tests carry.

The profile loader does not read ``trace:`` yet; the profiles that use it are shipped already
(``netem_profiles/README.md``, "Measured profiles"). Tests that load every shipped profile skip
nothing: they mark these with ``TRACE_LOADER`` (a strict xfail), so the day the loader reads traces
the marks fail and are removed.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from squall.profiles import PROFILE_DIR

_TRACE_KEY = re.compile(r"^[^#\n]*\btrace:", re.MULTILINE)

TRACE_LOADER = pytest.mark.xfail(strict=True, reason="trace loader not yet on main")


def uses_trace(path: Path) -> bool:
    """Whether the profile file gives some link scope a ``trace:`` (outside comments)."""
    return _TRACE_KEY.search(path.read_text(encoding="utf-8")) is not None


def shipped_paths() -> list[Path]:
    """Every shipped profile file, sorted."""
    return sorted(PROFILE_DIR.glob("*.yaml"))


def traced_paths() -> list[Path]:
    """The shipped profiles that use a trace."""
    return [path for path in shipped_paths() if uses_trace(path)]


def shipped_params() -> list[object]:
    """Every shipped profile as a pytest parameter, the traced ones marked ``TRACE_LOADER``."""
    return [pytest.param(path, id=path.stem, marks=[TRACE_LOADER] if uses_trace(path) else [])
            for path in shipped_paths()]
