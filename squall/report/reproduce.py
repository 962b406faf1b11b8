"""The report's fourth question: how do I reproduce it?

From a results file's plain data: the command that made it, Squall's version and commit, the
host (kernel, Python, CPUs, Docker) and its load before and after (a loaded host slows every
protocol, and says why a rerun differs), the shaping backends, the seeds, and the whole run as
a matrix file that ``squall matrix FILE`` takes back. Everything is text, built here: no
Python repr of a dict or a list reaches the page.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import yaml

from squall.run_trace import RunTrace

NOT_RECORDED = "not recorded"


def words(value: Any) -> str:
    """A value in words: mappings as ``key: value`` pairs, lists comma-separated, floats to 4 digits."""
    if isinstance(value, Mapping):
        return ", ".join(f"{k}: {words(v)}" for k, v in value.items()) or "-"
    if isinstance(value, list | tuple | set | frozenset):
        return ", ".join(words(v) for v in value) or "-"
    if isinstance(value, bool):
        return "yes" if value else "no"
    if isinstance(value, float):
        return f"{value:.4g}"
    return "-" if value is None else str(value)


def _plain(value: Any) -> Any:
    """Value as YAML-safe plain data (tuples as lists, unknown objects as text)."""
    if isinstance(value, Mapping):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if value is None or isinstance(value, bool | int | float | str):
        return value
    return str(value)


def matrix_text(traces: Sequence[RunTrace], run: Mapping[str, Any]) -> str:
    """The runs as a matrix file (YAML, block style): protocols, profiles, workers, seeds and the run."""
    data: dict[str, Any] = {
        "protocols": sorted({t.protocol for t in traces}),
        "profiles": sorted({t.profile for t in traces}),
        "workers": sorted({t.workers for t in traces}),
        "seeds": sorted({t.seed for t in traces}),
    }
    if run:
        data["run"] = _plain(run)
    return str(yaml.safe_dump(data, default_flow_style=False, sort_keys=False)).rstrip()


def _load(value: Any) -> str:
    if isinstance(value, list | tuple) and value:
        return " / ".join(f"{v:.2f}" if isinstance(v, int | float) else str(v) for v in value) + " (1, 5, 15 min)"
    return NOT_RECORDED


def reproduce_rows(meta: Mapping[str, Any], traces: Sequence[RunTrace]) -> list[tuple[str, str]]:
    """(label, text) pairs of the reproduce block."""
    raw = meta.get("provenance")
    prov: Mapping[str, Any] = raw if isinstance(raw, Mapping) else {}

    def get(key: str) -> str:
        value = prov.get(key, meta.get(key))
        return NOT_RECORDED if value in (None, "") else words(value)

    commit = get("commit")
    if prov.get("dirty"):
        commit += " (with local changes)"
    backends = sorted({t.backend for t in traces}) or [str(meta.get("shaping backend", NOT_RECORDED))]
    configs = sorted({words({k: getattr(t.meta, k) for k in ("task", "lr", "batch_size", "budget_s", "budget_steps")
                             if getattr(t.meta, k) is not None}) for t in traces})
    return [
        ("command", get("command")),
        ("working directory", get("cwd")),
        ("Squall version", get("squall_version")),
        ("commit", commit),
        ("seeds", words(sorted({t.seed for t in traces})) if traces else NOT_RECORDED),
        ("workers", words(sorted({t.workers for t in traces})) if traces else NOT_RECORDED),
        ("shaping backend", words(backends)),
        ("kernel", get("kernel")),
        ("Python", get("python")),
        ("host CPUs", get("cpus")),
        ("Docker", get("docker")),
        ("host load before", _load(prov.get("load_before"))),
        ("host load after", _load(prov.get("load_after"))),
        ("started (UTC)", get("started_utc")),
        ("elapsed", f"{prov['elapsed_s']} s" if "elapsed_s" in prov else words(meta.get("duration_s"))),
        ("per-run settings", "; ".join(configs) if configs else NOT_RECORDED),
    ]
