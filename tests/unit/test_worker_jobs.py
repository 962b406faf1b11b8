"""The job entry points on this machine: ``train`` over loopback TCP (threads), gloo jobs (processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from squall.job import JobContext, JobSpec, MetricsWriter
from squall.protocols.train import train
from squall.training.config import run_config
from squall.worker.registry import resolve

CLOCK_SLACK_S = 1e-5  # records round times to microseconds; asyncio may wake one clock tick early
PEERS = tuple(f"127.0.0.{i + 1}" for i in range(4))  # every 127/8 address is loopback on Linux


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _spec(entry: str, rank: int, out: Path, config: dict[str, Any], deadline: float | None = 60.0) -> JobSpec:
    return JobSpec(
        job_id="t",
        entry=entry,
        rank=rank,
        world_size=len(PEERS),
        peers=PEERS,
        out_dir=str(out / str(rank)),
        config=config,
        seed=5,
        deadline_s=deadline,
    )


def _run_threads(tmp_path: Path, config: dict[str, Any]) -> list[dict[str, Any]]:
    results: list[Any] = [None] * len(PEERS)

    def run(rank: int) -> None:
        spec = _spec("train", rank, tmp_path, config)
        Path(spec.out_dir).mkdir(parents=True)
        with MetricsWriter(Path(spec.out_dir) / "metrics.jsonl") as metrics:
            ctx = JobContext(spec=spec, out_dir=Path(spec.out_dir), metrics=metrics, started=time.monotonic())
            try:
                results[rank] = train(ctx)
            except Exception as exc:
                results[rank] = exc

    threads = [threading.Thread(target=run, args=(r,)) for r in range(len(PEERS))]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=120)
    for r in results:
        if isinstance(r, BaseException):
            raise r
    return results


def test_entry_points_are_registered() -> None:
    assert resolve("train") is train
    assert resolve("gloo_allreduce").__name__ == "gloo_allreduce"
    assert resolve("gloo_train").__name__ == "gloo_train"


def test_train_job_over_loopback_tcp(tmp_path: Path) -> None:
    config = {
        "task": "logreg_digits",
        "algorithm": "allreduce",
        "algorithm_args": {"collective": "ring"},
        "steps": 60,
        "lr": 0.5,
        "eval_every": 30,
        "port": _free_port(),
        "device": {"step_time_s": 0.001},
    }
    results = _run_threads(tmp_path, config)
    assert len({r["param_hash"] for r in results}) == 1
    assert all(r["steps"] == 60 and r["stopped_by"] == "steps" and r["world_size"] == 4 for r in results)
    assert results[0]["final_eval"]["accuracy"] > 0.8
    assert results[0]["bytes_sent"] > 60 * 2 * 3 / 4 * 650 * 4
    records = [json.loads(line) for line in (tmp_path / "0" / "metrics.jsonl").read_text().splitlines()]
    # The device model's guarantee, step by step, whatever the host's load: the compute phase lasts at
    # least step_time_s (real compute, then a sleep for the rest), and a step sleeps only when its real
    # compute was shorter than step_time_s (how long it sleeps, or whether any step does, depends on
    # the host: a slow host computes 1 ms steps without padding).
    steps = [r for r in records if "step" in r and "compute_s" in r]
    assert len(steps) == 60
    for r in steps:
        assert r["compute_s"] + r["sleep_s"] >= 0.001 - CLOCK_SLACK_S, r
        assert r["sleep_s"] == 0 or r["compute_s"] < 0.001 + CLOCK_SLACK_S, r
    for r in results:
        assert r["compute_s"] + r["sleep_s"] >= 60 * (0.001 - CLOCK_SLACK_S), r
    assert [r["step"] for r in records if "step" in r] == list(range(61))
    assert records[-1]["event"] == "end" and all("wall" in r for r in records)


def test_train_job_with_a_time_budget_and_gossip(tmp_path: Path) -> None:
    config = {
        "task": "quadratic",
        "algorithm": "dpsgd",
        "seconds": 1.0,
        "eval_every": 10,
        "lr": 0.2,
        "port": _free_port(),
    }
    results = _run_threads(tmp_path, config)
    assert {r["stopped_by"] for r in results} == {"seconds"} and len({r["steps"] for r in results}) == 1


def test_seconds_budget_is_capped_by_the_job_deadline(tmp_path: Path) -> None:
    with MetricsWriter(tmp_path / "m.jsonl") as metrics:
        ctx = JobContext(
            spec=_spec("train", 0, tmp_path, {"seconds": 600}, deadline=20.0),
            out_dir=tmp_path,
            metrics=metrics,
            started=time.monotonic(),
        )
        seconds = run_config(ctx).loop.seconds
        took = time.monotonic() - ctx.started  # however long a loaded host took to get here
        assert seconds is not None and 15.0 - took - CLOCK_SLACK_S <= seconds <= 15.0
        no_deadline = JobContext(
            spec=_spec("train", 0, tmp_path, {"steps": 5}, deadline=None),
            out_dir=tmp_path,
            metrics=metrics,
            started=time.monotonic(),
        )
        assert run_config(no_deadline).loop.seconds is None


def _run_processes(tmp_path: Path, entry: str, config: dict[str, Any]) -> list[dict[str, Any]]:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    tmp_path.mkdir(parents=True, exist_ok=True)
    procs = []
    for rank in range(len(PEERS)):
        spec = _spec(entry, rank, tmp_path, config)
        path = tmp_path / f"spec{rank}.json"
        path.write_text(json.dumps(spec.to_json()))
        procs.append(
            subprocess.Popen(
                [sys.executable, "-m", "squall.worker.process", str(path)],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.STDOUT,
            )
        )
    outputs = [p.communicate(timeout=120)[0].decode() for p in procs]
    for rank, p in enumerate(procs):
        assert p.returncode == 0, outputs[rank][-3000:]
    return [json.loads((tmp_path / str(r) / "result.json").read_text())["value"] for r in range(len(PEERS))]


@pytest.mark.slow
def test_gloo_jobs_in_four_processes(tmp_path: Path) -> None:
    bench = _run_processes(
        tmp_path / "bench", "gloo_allreduce", {"sizes": [4096, 1 << 20], "repetitions": 3, "port": _free_port()}
    )
    for res in bench:
        assert [s["bytes"] for s in res["sizes"]] == [4096, 1 << 20]
        assert all(0 < s["min_s"] <= s["median_s"] <= s["p90_s"] and s["busbw"] > 0 for s in res["sizes"])
    trained = _run_processes(
        tmp_path / "train", "gloo_train", {"steps": 100, "lr": 0.5, "eval_every": 50, "port": _free_port()}
    )
    assert len({r["param_hash"] for r in trained}) == 1
    assert trained[0]["final_eval"]["accuracy"] > 0.85 and trained[0]["traffic_estimated"] is True
