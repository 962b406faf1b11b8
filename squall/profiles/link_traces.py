"""Link traces: a file of timed rows that a link scope replays instead of (or beside) fixed settings.

A trace is a CSV or JSON file whose header names the columns: ``time`` and any of ``delay``,
``jitter``, ``rate``, ``loss`` for a link scope (:data:`LINK_COLUMNS`), or any of ``uplink`` and
``downlink`` for a ``links.nodes`` entry's access link (:data:`ACCESS_COLUMNS`). Each row's values
are written in the profile's own units (``2.5s``, ``40ms``, ``20mbit``, ``1%``) and read by the
same parsers as the keys, so a trace row accepts exactly what the key would. A row holds from its
``time`` until the next row's; the last row holds to the end of the run, or, when the trace loops,
until ``loop`` (the period) after which the trace starts again from its first row.

CSV: a header line, then one line per row, every cell filled; blank lines and lines starting with
``#`` are skipped. JSON: a list whose first element is the header (a list of column names) and
whose others are rows (lists of values), or a list of objects that all have the same keys.

What is refused, with the file, the row and the column: a file over :data:`MAX_TRACE_BYTES`, not
UTF-8, more than :data:`MAX_TRACE_ROWS` rows, an unknown or repeated column, no ``time`` or no
setting column, a row with a missing or extra cell, a value its key would refuse, a first row not
at ``0s``, times that do not increase by at least :data:`MIN_STEP_US`, and a loop period not after
the last row. :func:`parse_trace` is pure (bytes in, :class:`Trace` or :class:`ProfileError` out);
:func:`load_trace` reads the file a profile names, relative to the profile's folder.
"""

from __future__ import annotations

import bisect
import csv
import functools
import io
import json
import os
import stat
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from squall.profiles.bounds import parse_link_rate_bps
from squall.profiles.errors import Origin, ProfileError, Section, parse_at
from squall.profiles.model import Jitter, Loss
from squall.profiles.settings import BY_KEY
from squall.profiles.units import (
    DURATION_ALLOWED,
    UnitError,
    format_duration_us,
    format_probability,
    format_rate_bps,
    parse_duration_us,
)

TIME_COLUMN: Final = "time"
TRACE_COLUMNS: Final = ("delay", "jitter", "rate", "loss")  # the link settings a trace may change
ACCESS_KEYS: Final = ("uplink", "downlink")  # a node's shared access link, which a nodes entry's trace may change
MAX_TRACE_BYTES: Final = 4 << 20  # 4 MiB: an hour of 100 ms rows with four columns is about 1.5 MiB
MAX_TRACE_ROWS: Final = 36_000  # an hour of rows at the minimum step
MIN_STEP_US: Final = 100_000  # 100 ms: each change is a kernel update on every shaped link
SUFFIXES: Final = (".csv", ".json")
REF_ALLOWED: Final = "a file name (relative to the profile's folder) or {file: NAME, loop: PERIOD}"


@dataclass(frozen=True)
class Column:
    """A setting column a trace may have: the model field it sets and how a cell is read."""

    field: str  # the field it sets (a LinkSpec field, or uplink_bps/downlink_bps of a NodeLinkSpec)
    parse: Callable[[Origin, object], Any]  # (where the cell is, the cell) -> value; ProfileError when refused


#: The columns of a link scope's trace: each read by its row of the settings table.
LINK_COLUMNS: Final[Mapping[str, Column]] = {key: Column(BY_KEY[key].field, BY_KEY[key].parse) for key in TRACE_COLUMNS}
#: The columns of a ``links.nodes`` entry's trace: the node's shared uplink and downlink rates.
ACCESS_COLUMNS: Final[Mapping[str, Column]] = {
    key: Column(f"{key}_bps", lambda origin, raw: parse_at(origin, raw, parse_link_rate_bps)) for key in ACCESS_KEYS
}


def columns_allowed(columns: Mapping[str, Column]) -> str:
    """What a header may name, for messages."""
    return f"'{TIME_COLUMN}' and at least one of {', '.join(columns)}, each once"


COLUMNS_ALLOWED: Final = columns_allowed(LINK_COLUMNS)


@dataclass(frozen=True)
class TraceRow:
    """One row: from ``at_us`` on (until the next row), these settings hold."""

    at_us: int  # microseconds from the start of the trace
    values: tuple[tuple[str, object], ...]  # (LinkSpec field, parsed value), in column order


@dataclass(frozen=True)
class Trace:
    """A parsed trace: its columns and rows, and its period when it loops."""

    file: str  # the file it was read from (for messages and reports)
    columns: tuple[str, ...]  # the setting columns, as profile keys ("delay", "rate", "uplink", ...)
    rows: tuple[TraceRow, ...]  # at least one; the first at 0; times increase by >= MIN_STEP_US
    loop_us: int | None = None  # period when the trace repeats; None: the last row holds forever
    fields: tuple[str, ...] = ()  # the field each column sets, in column order (LinkSpec or NodeLinkSpec fields)

    @property
    def length_us(self) -> int:
        """How long one pass of the trace lasts: the loop period, or the start of its last row."""
        return self.loop_us if self.loop_us is not None else self.rows[-1].at_us

    def row_at(self, at_us: int) -> TraceRow:
        """The row in force ``at_us`` microseconds after the trace started (the first row before 0)."""
        if self.loop_us is not None and at_us >= 0:
            at_us %= self.loop_us
        index = bisect.bisect_right(self._starts, at_us) - 1
        return self.rows[max(0, index)]

    def values_at(self, at_us: int) -> tuple[tuple[str, object], ...]:
        """(LinkSpec field, value) of the row in force at ``at_us``."""
        return self.row_at(at_us).values

    def change_times_us(self, until_us: int) -> list[int]:
        """Times in ``(0, until_us)`` at which a new row starts (every pass, when it loops)."""
        times: list[int] = []
        if self.loop_us is None:
            return [row.at_us for row in self.rows if 0 < row.at_us < until_us]
        offset = 0
        while offset < until_us:
            times += [offset + row.at_us for row in self.rows if 0 < offset + row.at_us < until_us]
            offset += self.loop_us
        return times

    @functools.cached_property
    def _starts(self) -> list[int]:
        return [row.at_us for row in self.rows]

    def describe(self) -> str:
        """``steps-1s.csv: 60 rows of delay, rate, loss over 59s`` for listings."""
        looping = f", looping every {format_duration_us(self.loop_us)}" if self.loop_us is not None else ""
        return (f"{Path(self.file).name}: {len(self.rows)} rows of {', '.join(self.columns)} over "
                f"{format_duration_us(self.rows[-1].at_us)}{looping}")


def format_value(field: str, value: object) -> str:
    """A trace value written back in the profile's units (``40ms``, ``20mbit``, ``1%``)."""
    if isinstance(value, Jitter):
        text = format_duration_us(value.amount_us) if value.amount_us else "0"
        return text + (f" {value.distribution.value}" if value.amount_us and value.distribution != "uniform" else "")
    if isinstance(value, Loss):
        if value.gemodel is not None:
            return f"ge ~{format_probability(round(value.gemodel.mean_loss, 5))}"
        return format_probability(value.probability)
    if field.endswith("_bps"):
        return format_rate_bps(value) if isinstance(value, int) else "unlimited"
    if isinstance(value, int):
        return format_duration_us(value) if value else "0"
    return str(value)


def row_cells(trace: Trace, row: TraceRow) -> list[str]:
    """A row as text: its time, then each column in the profile's units."""
    values = dict(row.values)
    return [format_duration_us(row.at_us) if row.at_us else "0s",
            *(format_value(field, values[field]) for field in trace.fields)]


# ----------------------------------------------------------------------------- decoding


def _cells_of_csv(text: str) -> list[tuple[str, list[str]]]:
    """(where, cells) for every non-blank, non-comment line; where is ``line N``."""
    found: list[tuple[str, list[str]]] = []
    lines = text.splitlines()
    for number, line in enumerate(lines, start=1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            cells = next(csv.reader(io.StringIO(line), strict=True))
        except (csv.Error, StopIteration) as exc:
            raise ProfileError("", f"line {number}", f"not a CSV line: {exc}", value=line) from None
        found.append((f"line {number}", [cell.strip() for cell in cells]))
    return found


def _cells_of_json(text: str) -> list[tuple[str, list[object]]]:
    """(where, cells) for the header and every row of a JSON trace."""
    try:
        data = json.loads(text)
    except (ValueError, RecursionError) as exc:
        raise ProfileError("", "(top level)", f"not valid JSON: {exc}") from None
    if not isinstance(data, list):
        raise ProfileError("", "(top level)", "must be a list", value=data,
                           allowed="[[\"time\", \"delay\"], [\"0s\", \"40ms\"], ...] or [{\"time\": \"0s\", ...}, ...]")
    if data and all(isinstance(item, dict) for item in data):
        header = list(data[0])
        rows: list[tuple[str, list[object]]] = [("header", list(header))]
        for index, item in enumerate(data):
            assert isinstance(item, dict)
            if list(item) != header:
                raise ProfileError("", f"rows[{index}]", "its keys differ from the first row's", value=list(item),
                                   allowed=f"the keys {header} in that order")
            rows.append((f"rows[{index}]", list(item.values())))
        return rows
    found: list[tuple[str, list[object]]] = []
    for index, item in enumerate(data):
        if not isinstance(item, list):
            raise ProfileError("", f"[{index}]", "must be a list of cells", value=item,
                               allowed="a header list, then one list per row")
        found.append(("header" if index == 0 else f"rows[{index - 1}]", item))
    return found


def _header(cells: list[object], where: str, known: Mapping[str, Column]) -> tuple[str, ...]:
    allowed = columns_allowed(known)
    columns: list[str] = []
    for cell in cells:
        name = cell.strip() if isinstance(cell, str) else cell
        if name != TIME_COLUMN and name not in known:
            raise ProfileError("", f"{where}, header", "unknown column", value=cell, allowed=allowed)
        if name in columns:
            raise ProfileError("", f"{where}, header", "repeated column", value=cell, allowed=allowed)
        assert isinstance(name, str)
        columns.append(name)
    if TIME_COLUMN not in columns or len(columns) < 2:
        raise ProfileError("", f"{where}, header", "needs a time column and a setting column", value=cells,
                           allowed=allowed)
    return tuple(columns)


def _row(number: int, where: str, columns: tuple[str, ...], cells: list[object],
         known: Mapping[str, Column]) -> TraceRow:
    label = f"row {number} ({where})"
    if len(cells) != len(columns):
        raise ProfileError("", label, f"has {len(cells)} cells for {len(columns)} columns", value=cells,
                           allowed=f"one value for each of {', '.join(columns)}")
    at_us = 0
    values: list[tuple[str, object]] = []
    for column, cell in zip(columns, cells, strict=True):
        origin = Origin("", f"{label}, column {column}")
        if cell == "" or cell is None:
            raise origin.error("is empty", allowed="a value in every cell")
        if column == TIME_COLUMN:
            try:
                at_us = parse_duration_us(cell)
            except UnitError as exc:
                raise origin.error(exc.problem, value=cell, allowed=exc.allowed) from None
            continue
        setting = known[column]
        values.append((setting.field, setting.parse(origin, cell)))
    return TraceRow(at_us, tuple(values))


def parse_trace(data: bytes, file: str, *, loop_us: int | None = None,
                columns: Mapping[str, Column] = LINK_COLUMNS) -> Trace:
    """Decode and check a trace file's bytes; its suffix (``.csv``, ``.json``) says how. Pure.

    ``columns``: the setting columns the header may name (:data:`LINK_COLUMNS` for a link scope,
    :data:`ACCESS_COLUMNS` for a node's access link).

    :raises ProfileError: naming ``file``, the row and the column, for anything refused.
    """
    try:
        return _parse(data, file, loop_us, columns)
    except ProfileError as exc:
        raise with_file(file, exc) from None


def read_table(data: bytes, file: str, columns_allowed: str) -> list[tuple[str, list[object]]]:
    """(where, cells) of the header and every row of a CSV or JSON table file, checked for size,
    encoding and row count; raises ProfileError with an empty file name (the caller sets it)."""
    suffix = Path(file).suffix.lower()
    if suffix not in SUFFIXES:
        raise ProfileError("", "(top level)", f"unknown trace format {suffix or '(no suffix)'!r}",
                           allowed="a .csv or .json file")
    if len(data) > MAX_TRACE_BYTES:
        raise ProfileError("", "(top level)", f"the file is {len(data)} bytes long",
                           allowed=f"at most {MAX_TRACE_BYTES} bytes ({MAX_TRACE_BYTES >> 20} MiB)")
    try:
        text = data.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        raise ProfileError("", f"byte {exc.start}", "not UTF-8 text") from None
    if "\0" in text:
        raise ProfileError("", f"byte {text.index(chr(0))}", "a NUL character", allowed="UTF-8 text")
    lines: list[tuple[str, list[object]]] = []
    lines = [(where, list(cells)) for where, cells in _cells_of_csv(text)] if suffix == ".csv" else _cells_of_json(text)
    if not lines:
        raise ProfileError("", "(top level)", "the file is empty", allowed=f"a header ({columns_allowed}), then rows")
    if len(lines) == 1:
        raise ProfileError("", "(top level)", "the file has a header but no row", allowed="at least one row")
    if len(lines) - 1 > MAX_TRACE_ROWS:
        raise ProfileError("", "(top level)", f"the file has {len(lines) - 1} rows",
                           allowed=f"at most {MAX_TRACE_ROWS} rows")
    return lines


def with_file(file: str, exc: ProfileError) -> ProfileError:
    """``exc`` naming ``file`` when it names no file yet."""
    if exc.file:
        return exc
    return ProfileError(file, exc.key, exc.problem, value=exc.value, allowed=exc.allowed)


def _parse(data: bytes, file: str, loop_us: int | None, known: Mapping[str, Column]) -> Trace:
    lines = read_table(data, file, columns_allowed(known))
    header_at, header_cells = lines[0]
    columns = _header(header_cells, header_at, known)
    rows: list[TraceRow] = []
    for number, (where, cells) in enumerate(lines[1:], start=1):
        row = _row(number, where, columns, cells, known)
        time_origin = Origin("", f"row {number} ({where}), column {TIME_COLUMN}")
        if not rows and row.at_us != 0:
            raise time_origin.error("the first row must start at 0", value=format_duration_us(row.at_us),
                                    allowed="0s: a trace says what holds from its start")
        if rows and row.at_us < rows[-1].at_us + MIN_STEP_US:
            raise time_origin.error(
                f"comes {format_duration_us(row.at_us - rows[-1].at_us)} after the row before"
                if row.at_us > rows[-1].at_us else "is not after the row before",
                value=format_duration_us(row.at_us),
                allowed=f"times increasing by at least {format_duration_us(MIN_STEP_US)}")
        rows.append(row)
    if loop_us is not None and loop_us < rows[-1].at_us + MIN_STEP_US:
        raise ProfileError("", "loop", "the loop period must end after the last row",
                           value=format_duration_us(loop_us),
                           allowed=f"at least {format_duration_us(rows[-1].at_us + MIN_STEP_US)} "
                                   f"(the last row's time plus {format_duration_us(MIN_STEP_US)})")
    settings = tuple(c for c in columns if c != TIME_COLUMN)
    return Trace(file, settings, tuple(rows), loop_us, tuple(known[c].field for c in settings))


# ----------------------------------------------------------------------------- a profile's reference


def profile_folder(origin: Origin) -> Path:
    """The folder a profile's relative trace paths resolve against: the profile file's, else the cwd."""
    if origin.file.startswith("<") or not origin.file:
        return Path.cwd()
    return Path(origin.file).resolve().parent


def load_trace(origin: Origin, raw: object, columns: Mapping[str, Column] = LINK_COLUMNS) -> Trace:
    """Read the trace a link scope's (or a node entry's) ``trace:`` names (``NAME`` or ``{file: NAME,
    loop: PERIOD}``), with the setting ``columns`` its header may name."""
    loop_us: int | None = None
    if isinstance(raw, dict):
        section = Section(origin, raw, ("file", "loop"))
        name = section.value("file") if section.has("file") else None
        if name is None:
            raise origin.at("file").error("is required", allowed=REF_ALLOWED)
        loop_us = section.get("loop", parse_duration_us)
        if loop_us is not None and loop_us <= 0:
            raise origin.at("loop").error("must be longer than 0", value=raw["loop"], allowed=DURATION_ALLOWED)
        origin_of_name = origin.at("file")
    else:
        name, origin_of_name = raw, origin
    if not isinstance(name, str) or not name.strip():
        raise origin_of_name.error("must be a file name", value=name, allowed=REF_ALLOWED)
    path, data = read_referenced(origin_of_name, name, REF_ALLOWED)
    return parse_trace(data, str(path), loop_us=loop_us, columns=columns)


def read_referenced(origin: Origin, name: str, allowed: str) -> tuple[Path, bytes]:
    """The path and bytes of a table file a profile names at ``origin`` (relative: to its folder)."""
    path = Path(name) if os.path.isabs(name) else profile_folder(origin) / name
    if path.suffix.lower() not in SUFFIXES:
        raise origin.error("must be a .csv or .json file", value=name, allowed=allowed)
    try:
        info = path.stat()
        if not stat.S_ISREG(info.st_mode):
            raise origin.error(f"{path} is not a regular file", value=name, allowed=allowed)
        size = info.st_size
        if size > MAX_TRACE_BYTES:
            raise ProfileError(str(path), "(top level)", f"the file is {size} bytes long",
                               allowed=f"at most {MAX_TRACE_BYTES} bytes")
        with path.open("rb") as handle:
            return path, handle.read(MAX_TRACE_BYTES + 1)
    except FileNotFoundError:
        raise origin.error(f"no such file: {path}", value=name, allowed=allowed) from None
    except OSError as exc:
        raise origin.error(f"cannot read {path}: {exc.strerror or exc}", value=name) from None
