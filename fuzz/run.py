"""Coverage-guided fuzzing of every decoder with atheris (libFuzzer), one process per target.

    python -m fuzz.run all [--runs N] [--seconds S] [--json results/fuzz.json] [TARGET ...]
    python -m fuzz.run one TARGET [libFuzzer flags ...] [CORPUS_DIR ...]

``all`` runs each target in a child process for ``--runs`` inputs (or ``--seconds``, whichever
comes first), prints a table (target, inputs, coverage, features, peak RSS, findings) and writes
it as JSON. New inputs go to ``results/fuzz-corpus/TARGET`` (the seeds in ``fuzz/corpus/TARGET``
are only read); a crash, a timeout or an out-of-memory input is saved under
``results/fuzz-artifacts/TARGET/`` and counts as a finding. Exit status: 0 no finding, 1 findings.

Limits of every run (see ``fuzz/README.md``): ``-timeout=1`` (seconds per input),
``-rss_limit_mb`` = the child's RSS after imports + 64, ``-malloc_limit_mb=64``.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import subprocess
import sys
import time
from pathlib import Path
from typing import Final

ROOT: Final = Path(__file__).resolve().parents[1]
CORPUS: Final = ROOT / "fuzz" / "corpus"
RESULTS: Final = Path(os.environ.get("FUZZ_RESULTS", ROOT / "results"))  # new corpus, artifacts
TARGET_NAMES: Final = ("wire", "framing", "udp", "swarm", "moshpit", "compressed", "stragglers", "profile",
                              "trace", "lowcomm", "control")
PER_INPUT_SECONDS: Final = 1
MEMORY_MB: Final = 64  # per input, above the process's baseline
INSTRUMENTED: Final = ["squall.wire", "squall.transport", "squall.protocols.swarm", "squall.protocols.moshpit",
                       "squall.protocols.demo", "squall.training", "squall.profiles", "squall.worker.jsonline",
                       "squall.worker.commands"]
_STAT = re.compile(r"^stat::(\w+):\s+(\d+)", re.MULTILINE)
_PROGRESS = re.compile(r"^#(\d+)\s+\w+\s+cov: (\d+) ft: (\d+)", re.MULTILINE)


def rss_mb() -> int:
    """This process's resident set, MiB."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) // 1024
    return 0


def run_one(name: str, flags: list[str]) -> None:
    """Child: fuzz one target until libFuzzer stops (it exits the process)."""
    import atheris
    import numpy  # noqa: F401  (imported uninstrumented: only our decoders are)
    import torch  # noqa: F401
    import yaml  # noqa: F401

    with atheris.instrument_imports(include=INSTRUMENTED):
        from fuzz.targets import TARGETS
    function, allowed = TARGETS[name]

    def one_input(data: bytes) -> None:
        with contextlib.suppress(*allowed):  # the documented errors; anything else is a finding
            function(data)

    limits = [f"-timeout={PER_INPUT_SECONDS}", f"-rss_limit_mb={rss_mb() + MEMORY_MB}",
              f"-malloc_limit_mb={MEMORY_MB}"]
    atheris.Setup([sys.argv[0], *limits, *flags], one_input)
    atheris.Fuzz()


def fuzz_target(name: str, runs: int, seconds: int) -> dict[str, object]:
    """Parent: run one target in a child process; what it reached and found."""
    corpus_out = RESULTS / "fuzz-corpus" / name
    artifacts = RESULTS / "fuzz-artifacts" / name
    corpus_out.mkdir(parents=True, exist_ok=True)
    artifacts.mkdir(parents=True, exist_ok=True)
    flags = [f"-runs={runs}", "-print_final_stats=1", f"-artifact_prefix={artifacts}/"]
    flags += [f"-max_total_time={seconds}"] if seconds else []
    cmd = [sys.executable, "-m", "fuzz.run", "one", name, *flags, str(corpus_out), str(CORPUS / name)]
    started = time.monotonic()
    proc = subprocess.run(cmd, cwd=ROOT, capture_output=True, text=True, check=False)
    log = proc.stdout + proc.stderr
    stats = {key: int(value) for key, value in _STAT.findall(log)}
    progress = _PROGRESS.findall(log)
    cov, ft = (int(progress[-1][1]), int(progress[-1][2])) if progress else (0, 0)
    crashed = proc.returncode != 0
    return {
        "target": name,
        "inputs": stats.get("number_of_executed_units", int(progress[-1][0]) if progress else 0),
        "coverage": cov,
        "features": ft,
        "peak_rss_mb": stats.get("peak_rss_mb", 0),
        "seconds": round(time.monotonic() - started, 1),
        "findings": 1 if crashed else 0,
        "exit_code": proc.returncode,
        "artifacts": sorted(str(p) for p in artifacts.iterdir()),
        "tail": log[-3000:] if crashed else "",
    }


def table(rows: list[dict[str, object]]) -> str:
    """The results as a fixed-width table."""
    head = ("TARGET", "INPUTS", "COVERAGE", "FEATURES", "PEAK RSS MB", "SECONDS", "FINDINGS")
    keys = ("target", "inputs", "coverage", "features", "peak_rss_mb", "seconds", "findings")
    cells = [head, *[tuple(str(row[k]) for k in keys) for row in rows]]
    widths = [max(len(r[i]) for r in cells) for i in range(len(head))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(r, widths, strict=True)).rstrip() for r in cells)


def main(argv: list[str] | None = None) -> int:
    """Entry point (see the module docstring)."""
    args = sys.argv[1:] if argv is None else argv
    if args[:1] == ["one"]:
        run_one(args[1], args[2:])
        return 0
    parser = argparse.ArgumentParser(prog="python -m fuzz.run all", description=__doc__)
    parser.add_argument("mode", choices=["all"])
    parser.add_argument("targets", nargs="*", choices=[[], *TARGET_NAMES], default=[], metavar="TARGET")
    parser.add_argument("--runs", type=int, default=int(os.environ.get("FUZZ_RUNS", "1000000")))
    parser.add_argument("--seconds", type=int, default=int(os.environ.get("FUZZ_SECONDS", "0")),
                        help="stop each target after this long (0: no time limit)")
    parser.add_argument("--json", type=Path, default=RESULTS / "fuzz.json")
    options = parser.parse_args(args)
    rows = []
    for name in options.targets or TARGET_NAMES:
        rows.append(fuzz_target(name, options.runs, options.seconds))
        print(table(rows[-1:]).splitlines()[-1], flush=True)
    print(table(rows))
    for row in rows:
        if row["findings"]:
            print(f"\n{row['target']}: exit {row['exit_code']}, artifacts {row['artifacts']}\n{row['tail']}")
    options.json.parent.mkdir(parents=True, exist_ok=True)
    options.json.write_text(json.dumps(rows, indent=2) + "\n")
    return 1 if any(row["findings"] for row in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
