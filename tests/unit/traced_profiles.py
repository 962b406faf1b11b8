"""Which shipped profiles give a link scope a ``trace:`` (issue 29, ``squall/profiles/link_traces.py``)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from squall.profiles import PROFILE_DIR

_TRACE_KEY = re.compile(r"^[^#\n]*\btrace:", re.MULTILINE)


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
    """Every shipped profile as a pytest parameter named by its stem."""
    return [pytest.param(path, id=path.stem) for path in shipped_paths()]
