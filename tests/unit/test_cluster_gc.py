"""What ``squall gc`` finds of a shaper on the host (nfqueue work directory, delay daemon), no Docker."""

from __future__ import annotations

import subprocess
import sys
import tempfile
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest

from squall.cluster.gc import leftover_is_stale
from squall.shaping.nfqueue import leftovers
from squall.shaping.nfqueue.launcher import DAEMON_MODULE


@pytest.fixture
def tmp_root(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """The temp directory that make_workdir and find use, private to the test."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


@pytest.mark.parametrize(("name", "run"), [
    ("squall-nfq-ab12cd34ef-k2j4_x9q", "ab12cd34ef"),
    ("squall-nfq-t1234-abc", "t1234"),
    ("squall-nfq-run-with-dash-zz", "run-with-dash"),
    ("squall-nfq-abc.json", None),  # the launcher's untagged temporary config file
    ("squall-nfq-", None),
    ("squall-image-abc-def", None),
])
def test_the_run_id_is_read_from_the_work_directory_name(name: str, run: str | None) -> None:
    assert leftovers.run_of_workdir(name) == run


@pytest.mark.parametrize(("cmdline", "workdir"), [
    (["python3", "-m", "squall.shaping.nfqueue.cli", "--config", "/tmp/squall-nfq-r1-x/config.json",
      "--ready-fd", "5"], "/tmp/squall-nfq-r1-x"),
    (["python3", "-m", "squall.shaping.nfqueue.cli", "--config", "/tmp/squall-nfq-abc.json"], None),  # untagged
    (["python3", "-m", "squall.shaping.nfqueue.cli", "--config"], None),
    (["python3", "-m", "something.else", "--config", "/tmp/squall-nfq-r1-x/config.json"], None),
    ([], None),
])
def test_a_daemon_is_known_by_its_command_line(cmdline: list[str], workdir: str | None) -> None:
    assert leftovers.daemon_workdir(cmdline) == workdir


@pytest.mark.parametrize(("run", "owner_alive", "everything", "stale"), [
    ("dead1", True, False, True),  # its containers say the run is dead: goes, whatever the record says
    ("live1", False, False, False),  # its containers say the run lives: kept
    ("gone", False, False, True),  # Docker knows nothing of it, its recorded owner is dead
    ("gone", True, False, False),  # ...its recorded owner lives (a shaper without a cluster, a test)
    ("gone", None, False, True),  # nothing recorded (and old, or no directory at all)
    ("live1", True, True, True),  # --all
])
def test_which_leftovers_go(run: str, owner_alive: bool | None, everything: bool, stale: bool) -> None:
    got = leftover_is_stale(run, dead={"dead1"}, live={"live1"}, owner_alive=owner_alive, everything=everything)
    assert got is stale


def test_a_work_directory_records_its_run_and_owner(tmp_root: Path) -> None:
    path = Path(leftovers.make_workdir("r42"))
    assert path.parent == tmp_root
    (found,) = leftovers.find()
    me = psutil.Process()
    assert (found.run_id, found.workdir, found.owner_pid, found.daemons) == ("r42", path, me.pid, ())
    assert found.owner_start == pytest.approx(me.create_time(), abs=0.01)


@pytest.fixture
def fake_daemon(tmp_root: Path) -> Iterator[tuple[Path, subprocess.Popen[bytes]]]:
    """A process whose command line reads like a delay daemon's, started from a tagged work directory."""
    workdir = Path(leftovers.make_workdir("r7"))
    on_term = (f"open({str(tmp_root / 'terminated')!r}, 'w').close(); raise SystemExit(0)")
    code = (f"import signal, time\ndef term(*_):\n    {on_term}\nsignal.signal(signal.SIGTERM, term)\n"
            "print('ready', flush=True)\ntime.sleep(120)")
    proc = subprocess.Popen([sys.executable, "-c", code, DAEMON_MODULE,
                             "--config", str(workdir / leftovers.CONFIG_FILE)], stdout=subprocess.PIPE)
    assert proc.stdout is not None and proc.stdout.readline() == b"ready\n"  # its SIGTERM handler is in place
    try:
        yield workdir, proc
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_remove_stops_the_daemon_and_deletes_the_directory(fake_daemon: tuple[Path, subprocess.Popen[bytes]]) -> None:
    workdir, proc = fake_daemon
    (found,) = leftovers.find()
    assert found.daemons == (proc.pid,)
    assert leftovers.remove(found, timeout_s=5) == []
    assert not psutil.pid_exists(proc.pid)  # gone (and reaped: it was our child)
    assert (workdir.parent / "terminated").exists()  # by SIGTERM: a real daemon releases what it holds on it
    assert not workdir.exists()
    assert leftovers.find() == []


def test_a_daemon_whose_directory_is_gone_is_still_found(fake_daemon: tuple[Path, subprocess.Popen[bytes]]) -> None:
    workdir, proc = fake_daemon
    for child in workdir.iterdir():
        child.unlink()
    workdir.rmdir()
    (found,) = leftovers.find()
    assert (found.run_id, found.daemons, found.owner_pid) == ("r7", (proc.pid,), None)
