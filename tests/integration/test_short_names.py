"""A protocol declared by short name under the ``squall.protocols`` entry point of an installed package
runs in the containers by that name: from ``squall run``, a matrix and the pytest plugin (issue 40, item 4).

The package is docs/examples/myproto, installed (a real wheel build, non-editable) into a temporary
``--target`` folder that the commands get on their ``PYTHONPATH``: its ``pairavg`` is the shared
``train`` job with the algorithm ``pair_average``, so the containers must find the package *and*
its entry points (squall/protocols/catalog.py ``third_party_code``, squall/cluster/code_stage.py).
Each command runs one short cell of 2 workers on ``lan``; the algorithm's own figure
(``exchanges``, from its ``stats()``) in the records shows that it was this code that ran.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from squall.run_trace import RunTrace, trace_from_json

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "myproto"
NAME = "pairavg"
TIMEOUT_S = 600


@dataclass(frozen=True)
class Installed:
    """The example installed where the commands below find it."""

    site: Path  # the --target folder: myproto/ and myproto-0.1.0.dist-info/
    work: Path  # a scratch folder for reports, the matrix file and the plugin's test
    env: dict[str, str]  # the commands' environment: the folder on PYTHONPATH, a cache of their own


@pytest.fixture(scope="module")
def installed(tmp_path_factory: pytest.TempPathFactory) -> Installed:
    work = tmp_path_factory.mktemp("short-names")
    source = work / "myproto-src"  # a copy: the build writes build/ and *.egg-info next to the sources
    shutil.copytree(EXAMPLE, source, ignore=shutil.ignore_patterns("__pycache__", ".pytest_cache", "build",
                                                                   "*.egg-info"))
    site = work / "site"
    proc = subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                           "--target", str(site), str(source)], capture_output=True, text=True, timeout=300,
                          check=False)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert (site / "myproto" / "declare.py").is_file() and list(site.glob("myproto-*.dist-info/entry_points.txt"))
    env = {k: v for k, v in os.environ.items() if not k.startswith(("PYTEST", "SQUALL_CACHE"))}
    env.update(PYTHONPATH=os.pathsep.join([str(site), str(REPO)]), SQUALL_CACHE_DIR=str(work / "cache"),
               SQUALL_PROGRESS="plain")
    return Installed(site, work, env)


def _squall(installed: Installed, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "squall.cli.main", *args], cwd=installed.work, env=installed.env,
                          capture_output=True, text=True, timeout=TIMEOUT_S, check=False)


def _exchanged(trace: RunTrace) -> float:
    return max((r.extra.get("exchanges", 0.0) for r in trace.records), default=0.0)


def test_the_catalog_lists_the_short_name_with_its_distribution(installed: Installed) -> None:
    proc = _squall(installed, "protocols", "--json")
    assert proc.returncode == 0, proc.stderr[-3000:]
    rows = {row["name"]: row for row in json.loads(proc.stdout)}
    assert NAME in rows, sorted(rows)
    assert "myproto 0.1.0" in json.dumps(rows[NAME])


@pytest.mark.docker
def test_squall_run_runs_it_by_its_short_name(installed: Installed) -> None:
    proc = _squall(installed, "run", "--protocol", NAME, "--profile", "lan", "--workers", "2", "--seconds", "5",
                   "--json", "--report", str(installed.work / "run"))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    trace = trace_from_json(json.loads(proc.stdout.splitlines()[-1])["trace"])
    assert trace.workers == 2 and trace.records
    assert _exchanged(trace) > 0, "no record carries pair_average's exchanges: another algorithm ran"
    staged = [sorted(p.name for p in d.iterdir()) for d in (installed.work / "cache" / "ext").iterdir()]
    assert ["myproto", "myproto-0.1.0.dist-info"] in staged, staged  # a copy, never the folder it came from


@pytest.mark.docker
def test_a_matrix_names_it(installed: Installed) -> None:
    matrix = installed.work / "short.yaml"
    matrix.write_text(f"protocols: [{NAME}]\nprofiles: [lan]\nworkers: [2]\nrun: {{seconds: 5}}\ncalibrate: false\n")
    report = installed.work / "matrix"
    proc = _squall(installed, "matrix", str(matrix), "--report", str(report))
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    results = json.loads((report / "results.json").read_text())
    (cell,) = results["cells"]
    assert cell["id"].startswith(f"{NAME}-lan-w2"), cell["id"]
    assert _exchanged(trace_from_json(cell["trace"])) > 0


@pytest.mark.docker
def test_the_plugin_runs_a_marker_naming_it(installed: Installed) -> None:
    project = installed.work / "project"
    project.mkdir()
    (project / "test_short.py").write_text(
        "import pytest\n\n\n"
        f"@pytest.mark.squall(protocols=[{NAME!r}], profiles=['lan'], workers=2, seconds=5)\n"
        "def test_it_ran(squall_trace):\n"
        "    assert max(r.extra.get('exchanges', 0.0) for r in squall_trace.records) > 0\n")
    proc = subprocess.run([sys.executable, "-m", "pytest", "-v", "-p", "no:cacheprovider", "--squall-calibrate=off",
                           str(project)], cwd=project, env=installed.env, capture_output=True, text=True,
                          timeout=TIMEOUT_S, check=False)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
    assert f"test_it_ran[{NAME}-lan-w2] PASSED" in proc.stdout, proc.stdout[-3000:]
