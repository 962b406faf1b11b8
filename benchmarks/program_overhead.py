"""What running a program through Squall costs: the DDP example's median step time under ``squall run``
on ``lan`` against the same containers with no shaping and no Squall in the way.

    .venv/bin/python benchmarks/program_overhead.py --workers 4 --json results/bench-program-overhead.json
    .venv/bin/python benchmarks/program_overhead.py --backend nfqueue --rounds 3 --steps 200

One cluster of ``--workers`` containers mounts ``docs/examples/ddp``; then, in ``--rounds``
alternating rounds on those same containers (so that a background load that drifts hits both alike):

* **bare**: no shaping at all (the shaper cleared), and the script started in every container with
  ``docker exec`` as the same unprivileged user, with torchrun's environment and nothing else: no
  command runner, no stdout parsing, no counters;
* **squall**: :func:`squall.experiment.program.run_program` on the ``lan`` profile: the links shaped
  by the backend (``--backend``, default: the kernel's choice), the command runner reading every
  stdout line for figures, the kernel counters read every second;
* **runner** (what Squall costs apart from the emulation): ``run_program`` on a profile that sets
  nothing on any link, so nothing delays a packet; the backend only counts (the nfqueue backend's
  counting rules on the bridge, the netem backend's FIFO classes).

The order rotates (bare, squall, runner; squall, runner, bare; ...). A run's step time is the median
of the per-step intervals the script prints (``time`` on each ``step`` line, rank 0's clock; the
first ``--warmup`` steps left out), and the figure per mode is the median over its rounds. The
target (issue 43): squall / bare <= 1.10.

On the backends: ``lan`` is 0.1 ms (0.02 ms jitter) and 1 Gbit/s per link. Under nfqueue every
packet of the all-reduce crosses the delay daemon in user space on the host (and HTB in the sender);
under netem the delay is a kernel qdisc in the sender, with no process in the path. This host's
kernel has no ``sch_netem``, so only nfqueue is measured here; a run with ``--backend netem`` on a
kernel that has it gives its row.
"""

from __future__ import annotations

import argparse
import itertools
import json
import logging
import platform
import re
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from squall.experiment.lab import PROGRAM_MOUNT, Lab  # noqa: E402
from squall.experiment.program import run_program  # noqa: E402
from squall.programs.spec import program_from_args  # noqa: E402
from squall.worker.command import PROGRAM_GID, PROGRAM_UID, program_environment  # noqa: E402

logger = logging.getLogger("bench.program_overhead")

GOAL = 1.10  # squall's median step time / bare (issue 43)
EXAMPLE = REPO / "docs" / "examples" / "ddp"
PROFILE = "lan"
PORTS = iter(range(30100, 30400))  # away from the ports the lab gives run_program (29500-29899)
_STEP = re.compile(r"^step (\d+) loss \S+ time (\S+)")


def step_times(stdout: str, warmup: int) -> list[float]:
    """The intervals between consecutive steps the script printed, after ``warmup`` steps."""
    times = [(int(m.group(1)), float(m.group(2))) for m in map(_STEP.match, stdout.splitlines()) if m]
    return [t1 - t0 for (s0, t0), (s1, t1) in itertools.pairwise(times) if s1 == s0 + 1 and s0 >= warmup]


def bare(lab: Lab, argv: list[str]) -> str:
    """The script in every container with ``docker exec`` (as nobody, torchrun's environment); rank 0's stdout."""
    assert lab.cluster is not None and lab.shaper is not None
    lab.shaper.clear()
    nodes = lab.cluster.nodes
    peers = [n.address for n in nodes]
    port = next(PORTS)
    client = lab.cluster.client  # type: ignore[attr-defined]  # the local engine's Docker client
    outputs: dict[int, str] = {}
    errors: list[str] = []

    def one(rank: int) -> None:
        env = program_environment({"PYTHONPATH": "/squall/src", "OMP_NUM_THREADS": "1", "HOME": "/tmp"}, rank=rank,
                                  world_size=len(nodes), peers=peers, master_port=port, restart=0, out_dir="/tmp")
        result = client.api.exec_create(nodes[rank].container_id, ["/opt/venv/bin/python", *argv[1:]], environment=env,
                                        workdir=PROGRAM_MOUNT, user=f"{PROGRAM_UID}:{PROGRAM_GID}")
        out = client.api.exec_start(result["Id"]).decode(errors="replace")
        code = client.api.exec_inspect(result["Id"])["ExitCode"]
        if code != 0:
            errors.append(f"rank {rank} exited {code}: {out[-500:]}")
        outputs[rank] = out

    threads = [threading.Thread(target=one, args=(r,)) for r in range(len(nodes))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if errors:
        raise RuntimeError("; ".join(errors))
    return outputs[0]


UNSHAPED = "name: unshaped\ndescription: 'no setting on any link, nothing is emulated, links are only counted'\n" \
           "links:\n  default: {}\n"


def squall(lab: Lab, argv: list[str], logs: Path, seconds: float, profile: str = PROFILE) -> str:
    """The script through run_program on ``profile``; rank 0's stdout."""
    program = program_from_args(argv, metrics=[r"loss=step (?P<step>\d+) loss (?P<value>\S+)"], workdir=str(EXAMPLE))
    done = run_program(lab, program, profile, seconds=seconds, logs=logs)
    bad = [r.describe() for r in done.runs if r.failed or r.state != "exited"]
    if bad:
        raise RuntimeError("; ".join(bad))
    return (Path(done.runs[0].logs) / "stdout.txt").read_text()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--steps", type=int, default=200, help="steps of each run")
    parser.add_argument("--warmup", type=int, default=20, help="first steps left out of each run")
    parser.add_argument("--rounds", type=int, default=3, help="rounds of the three modes, in rotating order")
    parser.add_argument("--backend", choices=["netem", "nfqueue"], help="shaping backend (default: the kernel's)")
    parser.add_argument("--seconds", type=float, default=300.0, help="budget of one squall run")
    parser.add_argument("--json", type=Path, help="write the results here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    command = ["python", "train.py", "--steps", str(args.steps)]
    modes = ["bare", "squall", "runner"]
    medians: dict[str, list[float]] = {m: [] for m in modes}
    t0 = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="squall-bench-program-") as tmp, \
            Lab(workers=args.workers, backend=args.backend, workdir=str(EXAMPLE), preload=()) as lab:
        backend = lab.backend
        unshaped = Path(tmp) / "unshaped.yaml"
        unshaped.write_text(UNSHAPED)
        for k in range(args.rounds):
            for mode in modes[k % 3:] + modes[:k % 3]:
                logs = Path(tmp) / f"r{k}-{mode}"
                if mode == "bare":
                    out = bare(lab, command)
                else:
                    out = squall(lab, command, logs, args.seconds, PROFILE if mode == "squall" else str(unshaped))
                steps = step_times(out, args.warmup)
                if len(steps) < args.steps // 2:
                    raise RuntimeError(f"{mode}: only {len(steps)} step times in rank 0's output")
                medians[mode].append(statistics.median(steps))
                logger.info("round %d %s: median step %.2f ms over %d steps", k, mode, medians[mode][-1] * 1e3,
                            len(steps))
    bare_s, squall_s, runner_s = (statistics.median(medians[m]) for m in modes)
    ratio = squall_s / bare_s
    row = {"workers": args.workers, "backend": backend, "profile": PROFILE, "steps": args.steps,
           "rounds": args.rounds, "bare_ms": round(bare_s * 1e3, 3), "squall_ms": round(squall_s * 1e3, 3),
           "runner_ms": round(runner_s * 1e3, 3), "ratio": round(ratio, 3),
           "runner_ratio": round(runner_s / bare_s, 3), "goal": GOAL, "met": ratio <= GOAL,
           **{f"{m}_rounds_ms": [round(v * 1e3, 3) for v in medians[m]] for m in modes}}
    print(f"{'workers':>7} {'backend':>8} {'bare ms':>8} {'squall ms':>9} {'ratio':>6} {'runner ms':>9} "
          f"{'ratio':>6}  goal <= {GOAL}")
    print(f"{args.workers:>7} {backend:>8} {row['bare_ms']:>8.2f} {row['squall_ms']:>9.2f} {ratio:>6.3f} "
          f"{row['runner_ms']:>9.2f} {row['runner_ratio']:>6.3f}  {'met' if row['met'] else 'NOT met'}")
    print("rounds (ms): " + "; ".join(f"{m} {row[f'{m}_rounds_ms']}" for m in modes)
          + f"; {time.monotonic() - t0:.0f} s in all")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        result: dict[str, Any] = {"rows": [row], "host": platform.node(), "python": platform.python_version()}
        args.json.write_text(json.dumps(result, indent=2))
    return 0 if row["met"] else 1


if __name__ == "__main__":
    sys.exit(main())
