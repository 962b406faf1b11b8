"""A node's access link in a profile: uplink and downlink replayed from a trace, and NAT sites."""

from __future__ import annotations

from pathlib import Path

import pytest

from squall.profiles import NodeLinkSpec, ProfileError, load_profile, parse_profile
from squall.profiles.link_traces import ACCESS_COLUMNS, parse_trace
from squall.shaping.planning.state import state_at

ACCESS_CSV = "time,uplink,downlink\n0s,10mbit,50mbit\n1s,5mbit,40mbit\n2.5s,20mbit,100mbit\n"


def _profile(tmp: Path, body: str, trace: str = ACCESS_CSV, name: str = "p") -> Path:
    (tmp / "access.csv").write_text(trace)
    path = tmp / f"{name}.yaml"
    path.write_text(f"name: {name}\ndescription: test\n{body}")
    return path


def test_a_nodes_entry_replays_its_uplink_and_downlink_from_a_trace(tmp_path: Path) -> None:
    profile = load_profile(_profile(tmp_path, "links:\n  nodes:\n    - {nodes: all, trace: access.csv}\n"))
    assert profile.node_link(2, 4, 0.0) == NodeLinkSpec(10_000_000, 50_000_000)
    assert profile.node_link(2, 4, 1.2) == NodeLinkSpec(5_000_000, 40_000_000)
    assert profile.node_link(0, 4, 99.0) == NodeLinkSpec(20_000_000, 100_000_000)  # the last row holds
    assert profile.change_times() == (1.0, 2.5)
    assert [scope.patch.origin.key for scope in profile.traced_scopes()] == ["links.nodes[0]"]


def test_a_fixed_key_beside_the_trace_sets_what_the_trace_leaves_out(tmp_path: Path) -> None:
    trace = "time,uplink\n0s,10mbit\n1s,5mbit\n"
    path = _profile(tmp_path, "links:\n  nodes:\n    - {nodes: 1, trace: access.csv, downlink: 80mbit}\n", trace)
    profile = load_profile(path)
    assert profile.node_link(1, 3, 1.5) == NodeLinkSpec(5_000_000, 80_000_000)
    assert profile.node_link(0, 3, 1.5) == NodeLinkSpec()


def test_a_phase_trace_counts_from_the_phase_and_overrides_the_base_key_by_key(tmp_path: Path) -> None:
    body = ("links:\n  nodes:\n    - {nodes: all, uplink: 100mbit, downlink: 100mbit}\n"
            "phases:\n  - at: 10s\n    links:\n      nodes:\n        - {nodes: 0, trace: access.csv}\n")
    trace = "time,uplink\n0s,10mbit\n1s,5mbit\n"
    profile = load_profile(_profile(tmp_path, body, trace))
    assert profile.node_link(0, 2, 10.5) == NodeLinkSpec(10_000_000, 100_000_000)
    assert profile.node_link(0, 2, 11.0) == NodeLinkSpec(5_000_000, 100_000_000)
    assert profile.node_link(1, 2, 11.0) == NodeLinkSpec(100_000_000, 100_000_000)
    assert profile.change_times(20.0) == (10.0, 11.0)


@pytest.mark.parametrize(("trace", "key", "words"), [
    ("time,uplink\n0s,10mbit\n1s,-5mbit\n", "row 2 (line 3), column uplink", "rate"),
    ("time,uplink\n0s,10mbit\n1s,0\n", "row 2 (line 3), column uplink", "at least"),
    ("time,rate\n0s,10mbit\n", "line 1, header", "uplink, downlink"),
    ("time,uplink\n0s,10mbit\n0.05s,5mbit\n", "row 2 (line 3), column time", "100ms"),
    ("time,uplink\n1s,10mbit\n", "row 1 (line 2), column time", "0s"),
])
def test_bad_rows_of_an_access_trace_are_refused_naming_the_file_row_and_column(
        tmp_path: Path, trace: str, key: str, words: str) -> None:
    with pytest.raises(ProfileError) as err:
        load_profile(_profile(tmp_path, "links:\n  nodes:\n    - {nodes: all, trace: access.csv}\n", trace))
    assert err.value.file.endswith("access.csv")
    assert err.value.key == key
    assert words in str(err.value)


def test_a_key_both_fixed_and_traced_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as err:
        load_profile(_profile(tmp_path, "links:\n  nodes:\n    - {nodes: all, trace: access.csv, uplink: 5mbit}\n"))
    assert err.value.key == "links.nodes[0].uplink" and "column of the trace" in err.value.problem


def test_a_link_scope_trace_may_not_name_access_columns(tmp_path: Path) -> None:
    with pytest.raises(ProfileError) as err:
        load_profile(_profile(tmp_path, "links:\n  default: {trace: access.csv}\n"))
    assert "unknown column" in err.value.problem and "delay, jitter, rate, loss" in err.value.allowed


def test_the_access_columns_are_rates_of_the_node_link() -> None:
    trace = parse_trace(b"time,downlink\n0s,1gbit\n", "d.csv", columns=ACCESS_COLUMNS)
    assert trace.fields == ("downlink_bps",) and dict(trace.rows[0].values) == {"downlink_bps": 1_000_000_000}


# ----------------------------------------------------------------------------- NAT


def _nat(entries: str) -> str:
    return f"name: n\ndescription: nat\nlinks:\n  default: {{delay: 5ms}}\n  nodes:\n{entries}"


def test_nat_true_puts_each_node_behind_a_nat_of_its_own() -> None:
    profile = parse_profile(_nat("    - {nodes: odd, nat: true}\n"))
    assert profile.nat_sites(6) == ((1,), (3,), (5,))
    assert profile.nat_sites(1) == ()


def test_nodes_naming_one_site_share_its_nat() -> None:
    profile = parse_profile(_nat("    - {nodes: [1, 2], nat: home, uplink: 10mbit}\n"
                                 "    - {nodes: 3, nat: home}\n    - {nodes: 0, nat: false, uplink: 1gbit}\n"
                                 "    - {nodes: 4, nat: true}\n"))
    assert profile.nat_sites(5) == ((1, 2, 3), (4,))
    assert profile.validate_for(5) == []


@pytest.mark.parametrize("value", ["Home", "1site", "yes", "", 3, ["a"]])
def test_a_bad_nat_value_is_refused(value: object) -> None:
    with pytest.raises(ProfileError) as err:
        parse_profile(_nat(f"    - {{nodes: 1, nat: {value!r}}}\n"))
    assert err.value.key == "links.nodes[0].nat" and "site name" in err.value.allowed


def test_a_nat_entry_naming_a_node_the_run_does_not_have_is_refused() -> None:
    profile = parse_profile(_nat("    - {nodes: 5, nat: true}\n"))
    with pytest.raises(ProfileError) as err:
        profile.validate_for(4)
    assert err.value.key == "links.nodes[0].nodes" and "node 5" in err.value.problem


def test_nat_in_a_phase_is_refused() -> None:
    text = _nat("    - {nodes: 1, uplink: 5mbit}\n") + (
        "phases:\n  - at: 5s\n    links:\n      nodes:\n        - {nodes: 1, nat: true}\n")
    with pytest.raises(ProfileError) as err:
        parse_profile(text)
    assert err.value.key == "phases[0].links.nodes[0].nat" and "whole run" in err.value.problem


def test_duplication_into_a_node_behind_nat_is_allowed() -> None:
    """A duplicate is a copy of a packet on the bridge, which carries the node's own address (the NAT's
    translation is done in the namespaces), so it reaches the node like the packet it copies."""
    site = _nat("    - {nodes: [1, 2], nat: lab}\n")
    assert parse_profile(site + "  pairs:\n    - {link: '0 -> 2', duplicate: 1%}\n").validate_for(3) == []


def test_every_node_behind_nat_in_several_sites_is_warned_about() -> None:
    warnings = parse_profile(_nat("    - {nodes: all, nat: true}\n")).validate_for(3)
    assert len(warnings) == 1 and "every node of 3 is behind NAT, in 3 sites" in warnings[0]
    assert parse_profile(_nat("    - {nodes: all, nat: one}\n")).validate_for(3) == []


def test_nat_runs_on_the_local_engine_and_another_engine_refuses_it() -> None:
    """The local engine realises ``nat`` (its rules live in the containers' namespaces); the swarm engine
    would leave the node reachable, so a run there refuses it, naming the entry."""
    profile = parse_profile(_nat("    - {nodes: 0, uplink: 5mbit}\n    - {nodes: odd, nat: true}\n"))
    assert profile.runnable_for(4) == []
    assert state_at(profile, 4, 0.0).nat == ((1,), (3,))  # where every run plans its links
    with pytest.raises(ProfileError) as err:
        profile.runnable_for(4, engine="swarm")
    assert err.value.key == "links.nodes[1].nat" and "swarm engine does not put nodes behind NAT" in err.value.problem
    parse_profile(_nat("    - {nodes: 0, uplink: 5mbit}\n")).runnable_for(4, engine="swarm")  # no nat: runs
