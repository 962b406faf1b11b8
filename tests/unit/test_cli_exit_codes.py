"""The README's exit codes, per command: 0 success, 1 a run or check failed, 2 bad usage or input,
3 the environment is not ready. Nothing here needs Docker: bad input is refused before any cluster
starts, and ``DOCKER_HOST`` points at a socket that does not exist where an engine would be needed.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from squall.cli.main import EXIT_BROKEN_PIPE, EXIT_ENVIRONMENT, EXIT_USAGE, main
from squall.cluster.spec import ENGINE_ENV

pytest_plugins = ["pytester", "tests.pytester_preload"]

NO_ENGINE = "unix:///nonexistent/docker.sock"


@pytest.fixture(autouse=True)
def no_engine(monkeypatch: pytest.MonkeyPatch) -> None:
    """No Docker engine answers in these tests, whatever the machine has."""
    monkeypatch.setenv("DOCKER_HOST", NO_ENGINE)


@pytest.fixture
def bad_profile(tmp_path: Path) -> Path:
    path = tmp_path / "bad.yaml"
    path.write_text("name: bad\ndescription: d\nlinks: {default: {loss: 150%}}\n")
    return path


def code_of(*argv: str) -> int:
    try:
        return main(list(argv))
    except SystemExit as exc:  # argparse
        return int(exc.code or 0)


def test_profiles_validate_bad_file(bad_profile: Path) -> None:
    assert code_of("profiles", "validate", str(bad_profile)) == EXIT_USAGE


def test_profiles_show_unknown_name() -> None:
    assert code_of("profiles", "show", "no-such-profile") == EXIT_USAGE


def test_profiles_list_bad_option() -> None:
    assert code_of("profiles", "list", "--bogus") == EXIT_USAGE


def test_run_unknown_protocol() -> None:
    assert code_of("run", "--protocol", "no-such-protocol", "--profile", "lan") == EXIT_USAGE


def test_run_bad_profile_file(bad_profile: Path) -> None:
    assert code_of("run", "--protocol", "ring", "--profile", str(bad_profile)) == EXIT_USAGE


@pytest.mark.parametrize("target", ["accuracy", "accuracy=high", "=0.9", "accuracy=nan"])
def test_run_bad_target(target: str) -> None:
    assert code_of("run", "--protocol", "ring", "--profile", "lan", "--target", target) == EXIT_USAGE


def test_matrix_missing_file(tmp_path: Path) -> None:
    assert code_of("matrix", str(tmp_path / "none.yaml")) == EXIT_USAGE


def test_matrix_bad_file(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("protocols: [ring]\nprofiles: [lan]\nworkers: [0]\nseeds: [0]\n")
    assert code_of("matrix", str(path)) == EXIT_USAGE


def test_calibrate_bad_profile(bad_profile: Path) -> None:
    assert code_of("calibrate", "--profile", str(bad_profile)) == EXIT_USAGE


def test_calibrate_bad_workers() -> None:
    assert code_of("calibrate", "--profile", "lan", "--workers", "1") == EXIT_USAGE


def test_calibrate_unknown_engine() -> None:
    assert code_of("calibrate", "--profile", "lan", "--engine", "kubernetes-someday") == EXIT_USAGE


def test_claims_bad_option() -> None:
    assert code_of("claims", "--bogus") == EXIT_USAGE


def test_report_not_a_results_directory(tmp_path: Path) -> None:
    assert code_of("report", str(tmp_path)) == EXIT_USAGE


def test_cluster_bad_config() -> None:
    assert code_of("cluster", "noop", "--config", "{not json") == EXIT_USAGE


def test_cluster_bad_workers() -> None:
    assert code_of("cluster", "noop", "--workers", "0") == EXIT_USAGE


def test_demo_bad_workers() -> None:
    assert code_of("demo", "--workers", "0") == EXIT_USAGE


def test_unknown_command() -> None:
    assert code_of("no-such-command") == EXIT_USAGE


@pytest.mark.parametrize(
    "argv",
    [("image", "build"), ("image", "status"), ("image", "prune"), ("gc",), ("cluster", "noop", "--workers", "2")],
    ids=["image-build", "image-status", "image-prune", "gc", "cluster"],
)
def test_no_engine_is_an_environment_not_ready(argv: tuple[str, ...]) -> None:
    assert code_of(*argv) == EXIT_ENVIRONMENT


def test_a_closed_pipe_ends_quietly() -> None:
    """``squall profiles list | head``: the reader has gone before the first line is written."""
    squall = Path(sys.executable).with_name("squall")
    proc = subprocess.Popen([str(squall), "profiles", "list"], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            env={**os.environ, "DOCKER_HOST": NO_ENGINE})
    assert proc.stdout is not None and proc.stderr is not None
    proc.stdout.close()  # long before the interpreter has started
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == EXIT_BROKEN_PIPE
    assert "Traceback" not in err and "BrokenPipeError" not in err, err


@pytest.mark.parametrize(
    ("marker", "message"),
    [
        ("seconds=-1", "allowed: a number > 0"),
        ("steps='ten'", "allowed: an integer > 0"),
        ("target=0.9", "allowed: 'NAME<=NUMBER'"),
        ("lr=True", "allowed: a number > 0"),
        ("config=[1]", "allowed: a dict"),
        ("speed=3", "unknown argument(s) ['speed']"),
    ],
)
def test_bad_marker_arguments_are_usage_errors(pytester: pytest.Pytester, marker: str, message: str) -> None:
    pytester.makepyfile(f"""
        import pytest
        @pytest.mark.squall({marker})
        def test_x(squall_cell):
            pass
    """)
    result = pytester.runpytest("--collect-only", "-p", "no:cacheprovider")
    # raised while collecting: pytest reports it as a collection error and stops (exit 2), never as a test
    assert result.ret in (pytest.ExitCode.USAGE_ERROR, pytest.ExitCode.INTERRUPTED)
    assert "UsageError" in result.stdout.str() + result.stderr.str()
    assert message in result.stdout.str() + result.stderr.str()


# -- squall run -- COMMAND (a user's own program) -------------------------------------------------
@pytest.fixture
def program_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder with a script, readable by the unprivileged user programs run as; the current directory."""
    tmp_path.chmod(0o755)
    (tmp_path / "train.py").write_text("print('step 1 loss 1.0')\n")
    monkeypatch.chdir(tmp_path)
    return tmp_path


@pytest.mark.parametrize("argv", [
    ("--protocol", "ring", "--", "python", "train.py"),  # both a protocol and a command
    ("--",),  # neither
    ("--protocol", "ring", "--metric", "loss=loss (\\S+)"),  # a command's flag with a protocol
    ("--metric", "loss", "--", "python", "train.py"),
    ("--metric", "loss=(", "--", "python", "train.py"),
    ("--target", "loss<1", "--", "python", "train.py"),
    ("--workdir", "/nonexistent/folder", "--", "python", "train.py"),
    ("--requirements", "missing.txt", "--", "python", "train.py"),
    ("--pip", "-e .", "--", "python", "train.py"),
    ("--workers", "1", "--profile", "preemptible", "--", "python", "train.py"),
    ("--nproc-per-node", "0", "--", "python", "train.py"),  # ranks per node: 1..64
    ("--nproc-per-node", "65", "--", "python", "train.py"),
    ("--protocol", "ring", "--nproc-per-node", "2"),  # a command's flag with a protocol
])
def test_run_a_command_with_bad_usage(program_dir: Path, argv: tuple[str, ...]) -> None:
    profile = () if "--profile" in argv else ("--profile", "lan")
    assert code_of("run", *profile, *argv) == EXIT_USAGE


def test_run_a_command_without_an_engine_is_an_environment_not_ready(program_dir: Path) -> None:
    assert code_of("run", "--profile", "lan", "--", "python", "train.py") == EXIT_ENVIRONMENT
    assert code_of("run", "--profile", "lan", "--nproc-per-node", "2", "--", "python", "train.py") == EXIT_ENVIRONMENT


def test_image_build_with_requirements(program_dir: Path) -> None:
    assert code_of("image", "build", "--pip", "-r other.txt") == EXIT_USAGE
    assert code_of("image", "build", "--pip", "hivemind==1.1.12") == EXIT_ENVIRONMENT


@pytest.mark.parametrize("argv", [
    ("run", "--engine", "swarm", "--workers", "4", "--profile", "volunteers-behind-nat", "--", "python", "x.py"),
    ("calibrate", "--engine", "swarm", "--workers", "4", "--profile", "volunteers-behind-nat"),
])
def test_nat_on_the_swarm_engine_is_bad_input_before_any_engine_is_asked(
        argv: tuple[str, ...], caplog: pytest.LogCaptureFixture, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(ENGINE_ENV, "local")  # --engine sets it for the process: put back after the test
    assert code_of(*argv) == EXIT_USAGE
    assert "links.nodes[1].nat: the swarm engine does not put nodes behind NAT" in caplog.text
