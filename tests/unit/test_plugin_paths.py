"""The plugin finds a project's own files: entry points checked on the host at collection (with a fix
hint), relative profile paths resolved against the test file's folder then the rootdir (the error
lists where it looked), and the guide's example package collected and its in-process tests run.

Everything here stops at collection or runs in process: no Docker.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from squall.target import Target

pytest_plugins = ["pytester", "tests.pytester_preload"]

REPO = Path(__file__).resolve().parents[2]
EXAMPLE = REPO / "docs" / "examples" / "myproto"
PROFILE = "name: {name}\ndescription: a test's own profile.\nlinks:\n  default:\n    delay: {delay}\n"

ENTRY = '''
def main(ctx):
    return {}

def helper(ctx):
    return {}
'''


def _test_file(protocol: str = "ring", profile: str = "lan") -> str:
    return (
        "import pytest\n"
        f"@pytest.mark.squall(protocols=[{protocol!r}], profiles=[{profile!r}], workers=2)\n"
        "def test_x(squall_cell):\n"
        "    pass\n"
    )


def _output(result: pytest.RunResult) -> str:
    return result.stdout.str() + result.stderr.str()


# -- relative profile paths ----------------------------------------------------------------------

def test_a_relative_profile_is_found_next_to_the_test_file(pytester: pytest.Pytester) -> None:
    sub = pytester.mkdir("suite")
    (sub / "nets").mkdir()
    (sub / "nets" / "near.yaml").write_text(PROFILE.format(name="near", delay="3ms"))
    (sub / "test_near.py").write_text(_test_file(profile="nets/near.yaml"))
    result = pytester.runpytest("--collect-only", "-q", "suite")
    assert result.ret == 0, _output(result)
    result.stdout.fnmatch_lines(["*test_x?ring-near-w2?"])


def test_the_rootdir_is_the_fallback_and_the_test_folder_comes_first(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")  # the rootdir is pytester.path
    (pytester.path / "nets").mkdir()
    (pytester.path / "nets" / "far.yaml").write_text(PROFILE.format(name="far", delay="8ms"))
    (pytester.path / "nets" / "both.yaml").write_text("name: [this copy is broken\n")
    sub = pytester.mkdir("suite")
    (sub / "nets").mkdir()
    (sub / "nets" / "both.yaml").write_text(PROFILE.format(name="both", delay="1ms"))
    (sub / "test_far.py").write_text(_test_file(profile="nets/far.yaml"))
    (sub / "test_both.py").write_text(_test_file(profile="nets/both.yaml"))  # the broken root copy is not read
    result = pytester.runpytest("--collect-only", "-q", "suite")
    assert result.ret == 0, _output(result)
    result.stdout.fnmatch_lines(["*test_both.py::test_x?ring-both-w2?", "*test_far.py::test_x?ring-far-w2?"])


def test_a_missing_profile_file_lists_where_it_looked(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    sub = pytester.mkdir("suite")
    (sub / "test_missing.py").write_text(_test_file(profile="nets/absent.yaml"))
    result = pytester.runpytest("--collect-only", "suite")
    assert result.ret != 0
    out = _output(result)
    assert "profile file 'nets/absent.yaml' not found" in out
    assert str(sub / "nets" / "absent.yaml") in out  # the test file's folder
    assert str(pytester.path / "nets" / "absent.yaml") in out  # then the rootdir


def test_option_profiles_resolve_against_the_rootdir(pytester: pytest.Pytester) -> None:
    pytester.makeini("[pytest]\n")
    (pytester.path / "nets").mkdir()
    (pytester.path / "nets" / "opt.yaml").write_text(PROFILE.format(name="opt", delay="2ms"))
    sub = pytester.mkdir("suite")
    (sub / "test_opt.py").write_text("def test_x(squall_cell):\n    pass\n")
    result = pytester.runpytest("--collect-only", "-q", "--squall-profiles=lan,nets/opt.yaml", "suite")
    assert result.ret == 0, _output(result)
    result.stdout.fnmatch_lines(["*test_x?ring-lan-w4?", "*test_x?ring-opt-w4?"])


# -- entry points checked at collection ----------------------------------------------------------

def test_an_unimportable_package_gets_the_pythonpath_hint(pytester: pytest.Pytester) -> None:
    pkg = pytester.mkdir("src") / "hiddenproto_a"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "entry.py").write_text(ENTRY)
    pytester.makepyfile(test_hidden=_test_file(protocol="hiddenproto_a.entry:main"))
    result = pytester.runpytest("--collect-only")
    assert result.ret != 0
    out = _output(result)
    assert "protocol 'hiddenproto_a.entry:main': cannot import 'hiddenproto_a.entry'" in out
    assert "pythonpath" in out and "[tool.pytest.ini_options]" in out
    assert "Traceback" not in out  # one line that says what to do, not 40 lines of import machinery


def test_the_hint_works_pythonpath_makes_it_collect(pytester: pytest.Pytester) -> None:
    pkg = pytester.mkdir("src") / "hiddenproto_b"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "entry.py").write_text(ENTRY)
    pytester.makeini("[pytest]\npythonpath = src\n")
    pytester.makepyfile(test_found=_test_file(protocol="hiddenproto_b.entry:main"))
    result = pytester.runpytest("--collect-only", "-q")
    assert result.ret == 0, _output(result)
    result.stdout.fnmatch_lines(["*test_x?hiddenproto_b_entry_main-lan-w2?"])


@pytest.mark.parametrize(
    ("protocol", "module_text", "message"),
    [
        ("typoproto_c.entry:mian", ENTRY, "has no 'mian'; its functions: helper, main"),
        ("typoproto_d.entyr:main", ENTRY, "package 'typoproto_d' ("),
        ("typoproto_e.entry:main", "import not_a_real_dependency_xyz\n", "it imports 'not_a_real_dependency_xyz'"),
        ("typoproto_f.entry:main", "x = 1\nraise RuntimeError('boom at import')\n",
         "entry.py:2: RuntimeError: boom at import"),
        ("typoproto_g.entry:main", "main = 3\n", "is a int, not a function"),
    ],
    ids=["function-typo", "module-typo", "missing-dependency", "raises-on-import", "not-callable"],
)
def test_a_broken_entry_point_is_found_before_any_cluster(pytester: pytest.Pytester, protocol: str,
                                                          module_text: str, message: str) -> None:
    package = protocol.split(".", 1)[0]
    pkg = pytester.mkdir(package)
    (pkg / "__init__.py").write_text("")
    (pkg / "entry.py").write_text(module_text)
    pytester.makeini("[pytest]\npythonpath = .\n")
    pytester.makepyfile(test_broken=_test_file(protocol=protocol))
    result = pytester.runpytest("--collect-only")
    assert result.ret != 0
    out = _output(result)
    assert f"protocol {protocol!r}: " in out
    assert message in out
    assert "Traceback" not in out


# -- the guide's example -------------------------------------------------------------------------

@pytest.mark.slow
def test_the_guides_example_collects_with_its_own_profile_and_passes_in_process() -> None:
    """docs/examples/myproto as a user runs it (its own rootdir and pythonpath); the container cells are
    run by tests/integration/test_wheel_install.py from an installed wheel."""
    collect = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "--collect-only", "-q"],
                             cwd=EXAMPLE, capture_output=True, text=True, timeout=300, check=False)
    assert collect.returncode == 0, collect.stdout + collect.stderr
    ids = [line for line in collect.stdout.splitlines() if "::" in line]
    assert ids == [
        "tests/test_myproto.py::test_partners_pair_up_every_step",
        "tests/test_myproto.py::test_three_exchanges_average_eight_ranks_exactly",
        "tests/test_myproto.py::test_reaches_the_target_on_each_network[myproto_protocol_main-lan-w4]",
        "tests/test_myproto.py::test_reaches_the_target_on_each_network[myproto_protocol_main-wan_30ms_2pct-w4]",
    ]
    run = subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q", "-m", "not docker"],
                         cwd=EXAMPLE, capture_output=True, text=True, timeout=300, check=False)
    assert run.returncode == 0, run.stdout + run.stderr
    assert "2 passed, 2 deselected" in run.stdout


# -- matrices by name ----------------------------------------------------------------------------

def test_a_shipped_matrix_is_named_and_a_missing_one_lists_them(pytester: pytest.Pytester) -> None:
    pytester.makepyfile("def test_x(squall_cell):\n    pass\n")
    result = pytester.runpytest("--collect-only", "-q", "--squall-matrix=ci")
    assert result.ret == 0, _output(result)
    result.stdout.fnmatch_lines(["*test_x?ring-lan-w4?", "*test_x?matcha-lossy_1pct-w4?"])
    result = pytester.runpytest("--collect-only", "--squall-matrix=no-such-matrix")
    assert result.ret != 0
    out = _output(result)
    assert "--squall-matrix: no matrix named 'no-such-matrix'" in out and "ci" in out


def test_a_matrix_files_run_section_sets_the_cells_runs_under_the_marker() -> None:
    from squall.experiment.matrix import Cell
    from squall.pytest_plugin import _spec_from

    class Session:
        matrix_run: dict[str, object] = {"seconds": 7, "target": {"accuracy": 0.8}, "config": {"eval_every": 5}}

        def option(self, name: str) -> None:
            return None

    cell = Cell("ring", "lan", 4, 0)
    spec = _spec_from(cell, None, Session())  # type: ignore[arg-type]
    assert (spec.seconds, spec.target, dict(spec.config)) == (7, Target("accuracy", 0.8), {"eval_every": 5})
    marker = pytest.mark.squall(seconds=3, config={"eval_every": 2}).mark
    spec = _spec_from(cell, marker, Session())  # type: ignore[arg-type]
    assert (spec.seconds, spec.target, dict(spec.config)) == (3, Target("accuracy", 0.8), {"eval_every": 2})
