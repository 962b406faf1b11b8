"""``squall profiles list|show|validate``."""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import pytest

from squall.cli.profiles import add_subparser, main
from squall.profiles import PROFILE_DIR


def run(capsys: pytest.CaptureFixture[str], *argv: str) -> tuple[int, str, str]:
    code = main(["profiles", *argv])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_registers_on_a_parent_parser() -> None:
    parser = argparse.ArgumentParser()
    add_subparser(parser.add_subparsers(dest="command"))
    args = parser.parse_args(["profiles", "show", "lan", "--workers", "3", "--json"])
    assert (args.profile, args.workers, args.json, callable(args.func)) == ("lan", 3, True, True)


def test_list(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "list")
    assert code == 0
    assert out.splitlines()[0].split() == ["NAME", "DESCRIPTION"]
    assert any(line.startswith("wan-5ms ") for line in out.splitlines())


def test_list_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "list", "--json")
    names = {row["name"] for row in json.loads(out)}
    assert code == 0 and {"lan", "heterogeneous"} <= names


def test_show_table(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "heterogeneous", "--workers", "4", "--duration", "30s")
    assert code == 0
    assert "links from 0s (base):" in out and "links from 60s (phase congestion):" in out
    assert "3->0  25ms" in out
    assert "shared node rates:" in out and "devices:" in out


def test_show_json(capsys: pytest.CaptureFixture[str]) -> None:
    code, out, _ = run(capsys, "show", "preemptible", "-n", "3", "--json", "--duration", "20min")
    data = json.loads(out)
    assert code == 0 and data["workers"] == 3
    assert len(data["epochs"][0]["links"]) == 6
    assert data["epochs"][0]["links"][0]["delay_us"] == 1_000
    assert data["churn"] and data["churn"][0]["kind"] == "kill"
    assert [d["node"] for d in data["devices"]] == [0, 1, 2]


def test_show_defaults_to_enough_workers(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "p.yaml"
    path.write_text("name: p\ndescription: d\nlinks: {pairs: [{link: '0 -> 5', delay: 1ms}]}\n")
    code, out, _ = run(capsys, "show", str(path), "--json")
    assert code == 0 and json.loads(out)["workers"] == 6


def test_show_bad_profile(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "show", "no-such-profile")
    assert code == 2 and "no-such-profile" in err


def test_show_too_few_workers(capsys: pytest.CaptureFixture[str]) -> None:
    code, _, err = run(capsys, "show", "geo-2-regions", "-n", "1")
    assert code == 2 and "min_workers: the profile needs at least 2 workers" in err


def test_validate_shipped(capsys: pytest.CaptureFixture[str]) -> None:
    files = sorted(str(p) for p in PROFILE_DIR.glob("*.yaml"))
    code, out, _ = run(capsys, "validate", *files)
    assert code == 0
    assert out.count("ok ") == len(files)


def test_validate_reports_each_bad_file(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    good = tmp_path / "good.yaml"
    good.write_text("name: good\ndescription: d\n")
    bad = tmp_path / "bad.yaml"
    bad.write_text("name: bad\ndescription: d\nlinks: {default: {loss: 150%}}\n")
    small = tmp_path / "small.yaml"
    small.write_text("name: small\ndescription: d\nlinks: {pairs: [{link: '0 -> 5', delay: 1ms}]}\n")
    code, out, _ = run(capsys, "validate", str(good), str(bad), str(small), "-n", "4")
    lines = out.splitlines()
    assert code == 2
    assert lines[0].startswith(f"ok      {good}")
    assert lines[1].startswith(f"INVALID {bad}: links.default.loss:")
    assert lines[2].startswith(f"INVALID {small}: links.pairs[0].link: node 5 is out of range for 4")
    assert all(line.count(str(tmp_path)) == 1 for line in lines[1:3])


def test_validate_prints_warnings(capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:
    path = tmp_path / "w.yaml"
    path.write_text("name: w\ndescription: d\nlinks: {default: {delay: 1ms, jitter: 2ms}}\n")
    code, out, _ = run(capsys, "validate", str(path))
    assert code == 0 and "warning:" in out and "exceeds the delay" in out
