"""Link traces and availability traces: the decoders (hostile input too) and their use in profiles."""

from __future__ import annotations

import itertools
import json
from pathlib import Path

import pytest

from squall.profiles import ChurnKind, Loss, ProfileError, load_profile, parse_profile
from squall.profiles.availability import parse_availability
from squall.profiles.link_traces import MAX_TRACE_BYTES, MAX_TRACE_ROWS, MIN_STEP_US, parse_trace

GOOD_CSV = b"time,delay,rate,loss\n0s,20ms,25mbit,1%\n1s,5ms,100mbit,0%\n2.5s,100ms,10mbit,0.5%\n"


def test_a_csv_trace_reads_every_row_in_profile_units() -> None:
    trace = parse_trace(GOOD_CSV, "up.csv")
    assert trace.columns == ("delay", "rate", "loss")
    assert [row.at_us for row in trace.rows] == [0, 1_000_000, 2_500_000]
    first = dict(trace.rows[0].values)
    assert first["delay_us"] == 20_000 and first["rate_bps"] == 25_000_000 and first["loss"] == Loss(probability=0.01)


def test_each_row_holds_until_the_next() -> None:
    trace = parse_trace(GOOD_CSV, "up.csv")
    assert dict(trace.values_at(999_999))["delay_us"] == 20_000
    assert dict(trace.values_at(1_000_000))["delay_us"] == 5_000
    assert dict(trace.values_at(10**9))["delay_us"] == 100_000  # the last row holds to the end
    assert trace.change_times_us(10**9) == [1_000_000, 2_500_000]


def test_a_looping_trace_starts_again_after_its_period() -> None:
    trace = parse_trace(GOOD_CSV, "up.csv", loop_us=3_000_000)
    assert dict(trace.values_at(3_000_000))["delay_us"] == 20_000
    assert dict(trace.values_at(4_000_000))["delay_us"] == 5_000
    assert trace.change_times_us(7_000_000) == [1_000_000, 2_500_000, 3_000_000, 4_000_000, 5_500_000, 6_000_000]


@pytest.mark.parametrize("data", [
    json.dumps([["time", "delay"], ["0s", "40ms"], ["0.5s", "10ms"]]),
    json.dumps([{"time": "0s", "delay": "40ms"}, {"time": "0.5s", "delay": "10ms"}]),
])
def test_json_traces_as_a_header_and_rows_or_as_objects(data: str) -> None:
    trace = parse_trace(data.encode(), "t.json")
    assert [dict(row.values)["delay_us"] for row in trace.rows] == [40_000, 10_000]


def test_comments_and_blank_lines_are_skipped_and_rows_keep_their_line_numbers() -> None:
    data = b"# measured 2026\ntime,delay\n\n0s,1ms\n# a note\n1s,bad\n"
    with pytest.raises(ProfileError) as err:
        parse_trace(data, "c.csv")
    assert err.value.file == "c.csv"
    assert err.value.key == "row 2 (line 6), column delay"


# ----------------------------------------------------------------------------- hostile input


@pytest.mark.parametrize(("data", "key", "problem"), [
    (b"time,delay\n0s,40ms\n1s,-5ms\n", "row 2 (line 3), column delay", "negative"),
    (b"time,delay\n0s,40ms\n1s,\n", "row 2 (line 3), column delay", "is empty"),
    (b"time,delay\n0s,40ms\n1s\n", "row 2 (line 3)", "has 1 cells for 2 columns"),
    (b"time,delay\n0s,40ms\n1s,40ms,9\n", "row 2 (line 3)", "has 3 cells for 2 columns"),
    (b"time,delay,delay\n0s,1ms,1ms\n", "line 1, header", "repeated column"),
    (b"time,latency\n0s,1ms\n", "line 1, header", "unknown column"),
    (b"delay,rate\n1ms,1mbit\n", "line 1, header", "needs a time column"),
    (b"time\n0s\n", "line 1, header", "needs a time column"),
    (b"time,delay\n1s,40ms\n", "row 1 (line 2), column time", "must start at 0"),
    (b"time,delay\n0s,40ms\n0.05s,1ms\n", "row 2 (line 3), column time", "comes 50ms after"),
    (b"time,delay\n0s,40ms\n2s,1ms\n1s,1ms\n", "row 3 (line 4), column time", "is not after"),
    (b"time,delay\n0s,40ms\n1,1ms\n", "row 2 (line 3), column time", "needs a unit"),
    (b"time,rate\n0s,0mbit\n", "row 1 (line 2), column rate", ""),
    (b"time,loss\n0s,150%\n", "row 1 (line 2), column loss", ""),
    (b"time,delay\n", "(top level)", "header but no row"),
    (b"", "(top level)", "empty"),
    (b"time,delay\n0s,\xff\n", "byte 14", "not UTF-8"),
    (b"time,delay\n0s,1ms\x00\n", "byte 17", "NUL"),
    (b'time,delay\n0s,"1ms\n', "line 2", "not a CSV line"),
])
def test_malformed_rows_are_refused_naming_file_row_and_column(data: bytes, key: str, problem: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_trace(data, "/x/up.csv")
    assert err.value.file == "/x/up.csv"
    assert err.value.key == key
    assert problem in err.value.problem


@pytest.mark.parametrize(("data", "key"), [
    (b"{}", "(top level)"),
    (b"[[\"time\", \"delay\"], {\"time\": \"0s\"}]", "[1]"),
    (b"[{\"time\": \"0s\", \"delay\": \"1ms\"}, {\"delay\": \"1ms\", \"time\": \"1s\"}]", "rows[1]"),
    (b"[[\"time\", \"delay\"], [\"0s\", null]]", "row 1 (rows[0]), column delay"),
    (b"[[\"time\", \"delay\"], [\"0s\", [\"1ms\"]]]", "row 1 (rows[0]), column delay"),
    (b"[[\"time\", 3], [\"0s\", \"1ms\"]]", "header, header"),
    (b"[" * 100_000 + b"]" * 100_000, "(top level)"),
    (b"[[\"time\", \"delay\"], [\"0s\", \"1ms\"]", "(top level)"),
])
def test_malformed_json_is_refused(data: bytes, key: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_trace(data, "t.json")
    assert err.value.file == "t.json"
    assert err.value.key == key


def test_the_number_of_rows_and_the_size_are_bounded() -> None:
    rows = "".join(f"{i * MIN_STEP_US}us,1ms\n" for i in range(MAX_TRACE_ROWS + 1))
    with pytest.raises(ProfileError, match=f"at most {MAX_TRACE_ROWS} rows"):
        parse_trace(f"time,delay\n{rows}".encode(), "long.csv")
    with pytest.raises(ProfileError, match="bytes long"):
        parse_trace(b"time,delay\n0s,1ms\n" + b"#" * MAX_TRACE_BYTES, "big.csv")
    fine = "".join(f"{i * MIN_STEP_US}us,1ms\n" for i in range(MAX_TRACE_ROWS))
    assert len(parse_trace(f"time,delay\n{fine}".encode(), "ok.csv").rows) == MAX_TRACE_ROWS


def test_a_loop_must_end_after_the_last_row() -> None:
    with pytest.raises(ProfileError, match="loop period must end after the last row"):
        parse_trace(GOOD_CSV, "up.csv", loop_us=2_500_000)


def test_an_unknown_format_is_refused() -> None:
    with pytest.raises(ProfileError, match="unknown trace format"):
        parse_trace(GOOD_CSV, "up.txt")


# ----------------------------------------------------------------------------- in a profile


def write(tmp_path: Path, name: str, text: str | bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(text.encode() if isinstance(text, str) else text)
    return path


def test_a_trace_overrides_less_specific_scopes_key_by_key(tmp_path: Path) -> None:
    write(tmp_path, "pair.csv", "time,delay\n0s,50ms\n2s,70ms\n")
    profile = load_profile(write(tmp_path, "p.yaml", """
name: p
description: d
links:
  default: {delay: 5ms, rate: 10mbit}
  pairs:
    - {link: "0 -> 1", trace: pair.csv}
"""))
    assert profile.link(0, 1, 3, 0.0).delay_us == 50_000
    assert profile.link(0, 1, 3, 2.0).delay_us == 70_000
    assert profile.link(0, 1, 3, 2.0).rate_bps == 10_000_000  # the trace has no rate column
    assert profile.link(1, 0, 3, 2.0).delay_us == 5_000
    assert profile.explain(0, 1, 3, 2.0)["delay_us"] == "links.pairs[0].trace"
    assert profile.change_times(60.0) == (2.0,)


def test_a_trace_in_a_phase_counts_from_the_phase(tmp_path: Path) -> None:
    write(tmp_path, "t.csv", "time,delay\n0s,50ms\n1s,70ms\n")
    profile = load_profile(write(tmp_path, "p.yaml", """
name: p
description: d
links: {default: {delay: 5ms}}
phases:
  - {at: 10s, links: {default: {trace: {file: t.csv, loop: 2s}}}}
  - {at: 15s}
"""))
    assert [profile.link(0, 1, 2, t).delay_us for t in (9.9, 10.0, 11.0, 12.0, 13.5, 15.0)] == [
        5_000, 50_000, 70_000, 50_000, 70_000, 5_000]
    assert profile.change_times(60.0) == (10.0, 11.0, 12.0, 13.0, 14.0, 15.0)


def test_a_key_beside_a_trace_must_not_be_one_of_its_columns(tmp_path: Path) -> None:
    write(tmp_path, "t.csv", "time,delay\n0s,50ms\n")
    with pytest.raises(ProfileError) as err:
        load_profile(write(tmp_path, "p.yaml",
                           "name: p\ndescription: d\nlinks: {default: {delay: 1ms, trace: t.csv}}\n"))
    assert err.value.key == "links.default.delay"
    assert "also a column" in err.value.problem


def test_a_missing_trace_names_the_key_and_the_path(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as err:
        load_profile(write(tmp_path, "p.yaml", "name: p\ndescription: d\nlinks: {default: {trace: nope.csv}}\n"))
    assert err.value.key == "links.default.trace"
    assert str(tmp_path / "nope.csv") in err.value.problem


def test_a_bad_trace_row_names_the_trace_file(tmp_path: Path) -> None:
    bad = write(tmp_path, "t.csv", "time,delay\n0s,50ms\n1s,soon\n")
    with pytest.raises(ProfileError) as err:
        load_profile(write(tmp_path, "p.yaml", "name: p\ndescription: d\nlinks: {default: {trace: t.csv}}\n"))
    assert err.value.file == str(bad)
    assert err.value.key == "row 2 (line 3), column delay"


def test_combinations_are_checked_at_every_row(tmp_path: Path) -> None:
    write(tmp_path, "t.csv", "time,delay\n0s,50ms\n1s,0\n")
    with pytest.raises(ProfileError, match="reorder needs a delay"):
        load_profile(write(tmp_path, "p.yaml",
                           "name: p\ndescription: d\nlinks: {default: {reorder: 1%, trace: t.csv}}\n"))


def test_a_profile_from_a_string_resolves_traces_against_the_cwd(tmp_path: Path,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    write(tmp_path, "t.csv", "time,rate\n0s,5mbit\n")
    monkeypatch.chdir(tmp_path)
    profile = parse_profile("name: p\ndescription: d\nlinks: {default: {trace: t.csv}}\n")
    assert profile.link(0, 1, 2).rate_bps == 5_000_000


def test_shipped_steps_trace_changes_every_second() -> None:
    profile = load_profile("trace-steps-1s")
    assert profile.change_times(30.0) == tuple(float(t) for t in range(1, 30))
    specs = [profile.link(0, 1, 2, float(t)) for t in range(60)]
    assert all(a != b for a, b in itertools.pairwise(specs))


# ----------------------------------------------------------------------------- availability traces


def test_availability_rows_become_kill_and_restart_events(tmp_path: Path) -> None:
    write(tmp_path, "a.csv", "node,down,up\n1,2s,5s\n2,3s,\n")
    profile = load_profile(write(tmp_path, "p.yaml", "name: p\ndescription: d\nchurn: {trace: a.csv}\n"))
    events = [(e.at_s, e.kind, e.nodes) for e in profile.churn_events(4, 60.0)]
    assert events == [(2.0, ChurnKind.KILL, (1,)), (3.0, ChurnKind.KILL, (2,)), (5.0, ChurnKind.RESTART, (1,))]
    assert profile.required_workers() == 3


def test_availability_can_pause_instead(tmp_path: Path) -> None:
    write(tmp_path, "a.json", json.dumps([{"node": 0, "down": "1s", "up": "2s"}]))
    profile = load_profile(write(tmp_path, "p.yaml",
                                 "name: p\ndescription: d\nchurn: {trace: {file: a.json, kind: pause}}\n"))
    assert [e.kind for e in profile.churn_events(2, 60.0)] == [ChurnKind.PAUSE, ChurnKind.RESUME]


@pytest.mark.parametrize(("data", "key", "problem"), [
    (b"node,down\n1,2s\n", "line 1, header", "wrong columns"),
    (b"node,down,up\nx,2s,3s\n", "row 1 (line 2), column node", "not a node index"),
    (b"node,down,up\n1,,3s\n", "row 1 (line 2), column down", "is empty"),
    (b"node,down,up\n1,4s,3s\n", "row 1 (line 2), column up", "is not after down"),
    (b"node,down,up\n1,4,5s\n", "row 1 (line 2), column down", "needs a unit"),
])
def test_malformed_availability_rows_are_refused(data: bytes, key: str, problem: str) -> None:
    with pytest.raises(ProfileError) as err:
        parse_availability(data, "/x/a.csv")
    assert err.value.file == "/x/a.csv"
    assert err.value.key == key
    assert problem in err.value.problem


def test_availability_is_validated_like_events(tmp_path: Path) -> None:
    write(tmp_path, "a.csv", "node,down,up\n1,2s,5s\n1,4s,6s\n")
    with pytest.raises(ProfileError, match=r"a.csv row 2 \(line 3\): cannot kill node 1 at 4s: it is killed"):
        load_profile(write(tmp_path, "p.yaml", "name: p\ndescription: d\nchurn: {trace: a.csv}\n"))
    write(tmp_path, "b.csv", "node,down,up\n7,2s,5s\n")
    profile = load_profile(write(tmp_path, "q.yaml", "name: q\ndescription: d\nchurn: {trace: b.csv}\n"))
    assert profile.required_workers() == 8
    with pytest.raises(ProfileError, match="out of range for 4 workers"):
        profile.validate_for(4)


def test_show_prints_each_trace_and_its_rows(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from squall.cli.profiles import main

    write(tmp_path, "t.csv", "time,delay,rate\n0s,50ms,10mbit\n1s,70ms,20mbit\n2s,10ms,30mbit\n")
    path = write(tmp_path, "p.yaml", "name: p\ndescription: d\nlinks: {default: {trace: t.csv}}\n")
    assert main(["profiles", "show", str(path), "-n", "2", "--rows", "2"]) == 0
    out = capsys.readouterr().out
    assert "trace at links.default from 0s: t.csv: 3 rows of delay, rate over 2s" in out
    assert "1s    70ms   20mbit" in out and "... 1 more rows" in out
    assert main(["profiles", "show", str(path), "-n", "2", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["traces"][0]["rows"] == [["0s", "50ms", "10mbit"], ["1s", "70ms", "20mbit"], ["2s", "10ms", "30mbit"]]
    assert data["change_times_s"] == [1.0, 2.0]
