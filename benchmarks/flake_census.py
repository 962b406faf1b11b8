"""Flake census: run timing gates again and again in the suite's conditions, and count failures.

Each round runs the given pytest node ids in one pytest process (so each test has its module's
fixtures, as in ``make test``) beside ``--busy`` CPU-bound host processes at normal priority
(``while True: pass``), reads the outcome of every test from a JUnit XML report, and keeps the
first line of each failure's message (what was measured when it failed). The table gives, per
test, the rounds, the failures and those messages; ``--json`` writes them too.

    .venv/bin/python benchmarks/flake_census.py --rounds 20 --busy 1 \\
        "tests/integration/test_shaping_conformance.py::test_a_phase_takes_effect_within_100_ms[nfqueue]" \\
        "tests/integration/test_shaping_conformance.py::test_a_per_pair_setting_changes_only_that_pair[nfqueue]"

A gate meant to fail at most once in 200 runs shows no failure in 20 with probability 0.90; one
failure in 20 is already evidence against it (p = 0.095 for a 1/200 gate), two are strong evidence.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path

logger = logging.getLogger("flake_census")
REPO = Path(__file__).resolve().parents[1]


@dataclass
class Tally:
    """One test's outcomes over the rounds."""

    test: str
    passed: int = 0
    failed: int = 0
    skipped: int = 0
    messages: list[str] = field(default_factory=list)


@contextlib.contextmanager
def busy(count: int) -> Iterator[None]:
    """``count`` CPU-bound processes at normal priority for the duration of the block."""
    procs = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for proc in procs:
            proc.kill()
            proc.wait()


def outcomes(report: Path) -> dict[str, tuple[str, str]]:
    """``{node id: (outcome, first line of the message)}`` from a JUnit XML report."""
    out: dict[str, tuple[str, str]] = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        path = case.get("classname", "").replace(".", "/")
        name = case.get("name", "")
        node = f"{path}.py::{name}"
        outcome, message = "passed", ""
        for kind in ("failure", "error", "skipped"):
            element = case.find(kind)
            if element is not None:
                outcome = "skipped" if kind == "skipped" else "failed"
                lines = (element.get("message") or element.text or "").strip().splitlines()
                message = lines[0][:300] if lines else ""
                break
        out[node] = (outcome, message)
    return out


def census(tests: list[str], rounds: int, busy_count: int, extra: list[str]) -> dict[str, Tally]:
    tallies: dict[str, Tally] = {}
    with tempfile.TemporaryDirectory(prefix="squall-census-") as tmp:
        for k in range(rounds):
            report = Path(tmp) / f"round{k}.xml"
            start = time.monotonic()
            with busy(busy_count):
                subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                                f"--junitxml={report}", *extra, *tests], cwd=REPO, check=False,
                               stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env={**os.environ})
            if not report.exists():
                raise SystemExit(f"round {k}: pytest wrote no report (a collection error?): {tests}")
            for node, (outcome, message) in outcomes(report).items():
                tally = tallies.setdefault(node, Tally(node))
                setattr(tally, outcome, getattr(tally, outcome) + 1)
                if message and outcome == "failed":
                    tally.messages.append(message)
            failed = sum(1 for o, _ in outcomes(report).values() if o == "failed")
            logger.info("round %d/%d: %d failed in %.0f s, load %.1f", k + 1, rounds, failed,
                        time.monotonic() - start, os.getloadavg()[0])
    return tallies


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tests", nargs="+", help="pytest node ids (or files), run together each round")
    parser.add_argument("--rounds", type=int, default=20)
    parser.add_argument("--busy", type=int, default=1, help="CPU-bound neighbours during each round")
    parser.add_argument("--pytest-arg", action="append", default=[], help="passed to pytest (repeatable)")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args(argv)
    if args.rounds < 1 or args.busy < 0:
        parser.error("--rounds must be at least 1 and --busy at least 0")
    logging.basicConfig(level=logging.INFO, format="%(message)s")
    tallies = census(args.tests, args.rounds, args.busy, args.pytest_arg)
    print(f"{'test':<100} {'passed':>6} {'failed':>6} {'skipped':>7}")
    for t in tallies.values():
        print(f"{t.test[-100:]:<100} {t.passed:>6} {t.failed:>6} {t.skipped:>7}")
        for message in t.messages:
            print(f"    {message}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps({"rounds": args.rounds, "busy": args.busy,
                                         "tests": [asdict(t) for t in tallies.values()]}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
