"""SIGTERM stops a test session as Ctrl-C does: at once, with every fixture's teardown run.

A CI runner cancels a job with SIGTERM; before, the cluster layer turned it into ``SystemExit``, which
pytest counted as one failed test before it went on with the rest (containers and all).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

SUITE = '''
import time
import pytest

from squall.cluster import lifecycle


class Held:
    def close(self) -> None:
        pass


@pytest.fixture
def held(tmp_path_factory):
    lifecycle.register(Held())  # what a cluster does: installs its own SIGTERM handler where none is set
    yield
    open({teardown!r}, "w").write("torn down")


def test_waits(held):
    open({started!r}, "w").write("started")
    time.sleep(120)


def test_after():
    open({after!r}, "w").write("ran")
'''


#: The child pytest, with SIGTERM and SIGHUP at their defaults as in a shell: a parent started under
#: ``nohup`` passes SIGHUP on ignored, and the plugin rightly leaves an ignored signal alone (a CI
#: rehearsal run under nohup timed this test out).
CHILD = ("import signal, sys, pytest\n"
         "for s in (signal.SIGTERM, signal.SIGHUP):\n"
         "    signal.signal(s, signal.SIG_DFL)\n"
         "sys.exit(pytest.main(sys.argv[1:]))\n")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP], ids=["SIGTERM", "SIGHUP"])
def test_a_stop_signal_ends_the_session_and_tears_fixtures_down(tmp_path: Path, sig: signal.Signals) -> None:
    started, teardown, after = (tmp_path / n for n in ("started", "teardown", "after"))
    suite = tmp_path / "test_suite.py"
    suite.write_text(SUITE.format(started=str(started), teardown=str(teardown), after=str(after)))
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    proc = subprocess.Popen(
        [sys.executable, "-c", CHILD, "-q", "-p", "no:cacheprovider", str(suite)],
        cwd=tmp_path, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
    )
    try:
        deadline = time.monotonic() + 120  # generous: a test that never reaches the sleep fails below anyway
        while not started.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert started.exists(), proc.communicate(timeout=30)[0] if proc.poll() is not None else "never started"
        proc.send_signal(sig)
        output, _ = proc.communicate(timeout=180)  # a loaded host tears down slowly
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == pytest.ExitCode.INTERRUPTED, output
    assert teardown.read_text() == "torn down", output
    assert not after.exists(), "the session went on after the signal:\n" + output
    assert f"stopped by {sig.name}" in output, output
