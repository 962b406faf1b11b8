"""Availability traces: ``churn: {trace: FILE}``, one row per time a node is away.

The file is a CSV or JSON table (read like a link trace, :func:`~.traces.read_table`) with the
columns ``node``, ``down`` and ``up``: the node (an index, ``-1`` the last) leaves at ``down``
(seconds from the start of the run, in the profile's units: ``30s``, ``2.5min``) and comes back at
``up``; an empty ``up`` means it stays away until the run ends. Written as
``{trace: {file: FILE, kind: pause}}``, a node that is away is paused (and resumed) instead of
killed (and restarted). Each row becomes one ``churn.events`` entry (a kill with a duration), so it
is expanded and validated exactly like one: indices beyond the cluster, a node leaving while it is
away, ``up`` not after ``down`` are refused with the file and the row.
"""

from __future__ import annotations

from pathlib import Path
from typing import Final

from squall.profiles.churn import ScheduledEvent
from squall.profiles.errors import Origin, ProfileError, Section
from squall.profiles.link_traces import read_referenced, read_table, with_file
from squall.profiles.model import ChurnKind
from squall.profiles.selectors import parse_selector
from squall.profiles.units import UnitError, parse_duration_us

COLUMNS: Final = ("node", "down", "up")
COLUMNS_ALLOWED: Final = "the columns node, down and up, each once (up may be left empty: away until the end)"
KINDS: Final = {"kill": ChurnKind.KILL, "pause": ChurnKind.PAUSE}
REF_ALLOWED: Final = "a file name (relative to the profile's folder) or {file: NAME, kind: kill|pause}"


def _time(origin: Origin, cell: object) -> int:
    try:
        return parse_duration_us(cell)
    except UnitError as exc:
        raise origin.error(exc.problem, value=cell, allowed=exc.allowed) from None


def _node(origin: Origin, cell: object) -> object:
    """A node index from a cell (CSV cells are strings: ``"3"`` is node 3)."""
    if isinstance(cell, str):
        text = cell.strip()
        if text.lstrip("-").isdigit():
            return int(text)
        raise origin.error("not a node index", value=cell, allowed="a node index (0, 3; -1 is the last)")
    if isinstance(cell, bool) or not isinstance(cell, int):
        raise origin.error("not a node index", value=cell, allowed="a node index (0, 3; -1 is the last)")
    return cell


def parse_availability(data: bytes, file: str, kind: ChurnKind = ChurnKind.KILL) -> tuple[ScheduledEvent, ...]:
    """Decode an availability table into churn events (``kind`` with a duration, or without one when
    the node never returns). Pure.

    :raises ProfileError: naming ``file``, the row and the column, for anything refused.
    """
    try:
        return _parse(data, file, kind)
    except ProfileError as exc:
        raise with_file(file, exc) from None


def _parse(data: bytes, file: str, kind: ChurnKind) -> tuple[ScheduledEvent, ...]:
    lines = read_table(data, file, COLUMNS_ALLOWED)
    where, header = lines[0]
    names = [cell.strip() if isinstance(cell, str) else cell for cell in header]
    if sorted(map(str, names)) != sorted(COLUMNS) or len(names) != len(COLUMNS):
        raise ProfileError("", f"{where}, header", "wrong columns", value=header, allowed=COLUMNS_ALLOWED)
    position = {str(name): index for index, name in enumerate(names)}
    events: list[ScheduledEvent] = []
    name = Path(file).name
    for number, (at, cells) in enumerate(lines[1:], start=1):
        label = f"row {number} ({at})"
        if len(cells) != len(COLUMNS):
            raise ProfileError("", label, f"has {len(cells)} cells for 3 columns", value=cells,
                               allowed="node, down and up")
        cell = {column: cells[position[column]] for column in COLUMNS}
        for column in ("node", "down"):
            if cell[column] in ("", None):
                raise Origin("", f"{label}, column {column}").error("is empty", allowed="a value")
        node_origin = Origin("", f"{label}, column node")
        selector = parse_selector(Origin(file, f"{name} {label}, column node"),
                                  _node(node_origin, cell["node"]))
        down = _time(Origin("", f"{label}, column down"), cell["down"])
        up = None if cell["up"] in ("", None) else _time(Origin("", f"{label}, column up"), cell["up"])
        if up is not None and up <= down:
            raise Origin("", f"{label}, column up").error("is not after down", value=cell["up"],
                                                          allowed="a time after the row's down")
        events.append(ScheduledEvent(origin=Origin(file, f"{name} {label}"), at_us=down, kind=kind,
                                     nodes=selector, duration_us=None if up is None else up - down))
    return tuple(events)


def load_availability(origin: Origin, raw: object) -> tuple[ScheduledEvent, ...]:
    """Read the availability trace ``churn.trace`` names (``NAME`` or ``{file: NAME, kind: pause}``)."""
    kind = ChurnKind.KILL
    name: object = raw
    name_origin = origin
    if isinstance(raw, dict):
        section = Section(origin, raw, ("file", "kind"))
        if not section.has("file"):
            raise origin.at("file").error("is required", allowed=REF_ALLOWED)
        name, name_origin = section.value("file"), origin.at("file")
        if section.has("kind"):
            written = section.value("kind")
            if written not in KINDS:
                raise origin.at("kind").error("unknown kind", value=written, allowed="kill or pause")
            kind = KINDS[str(written)]
    if not isinstance(name, str) or not name.strip():
        raise name_origin.error("must be a file name", value=name, allowed=REF_ALLOWED)
    path, data = read_referenced(name_origin, name, REF_ALLOWED)
    return parse_availability(data, str(path), kind)
