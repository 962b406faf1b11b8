"""A program's folder is copied for the containers: readable by everyone, the source untouched, the copy
what ran (its digest), with excludes and a size limit; a git ref's folder is copied from ``git archive``."""

from __future__ import annotations

import os
import stat
import subprocess
from pathlib import Path

import pytest

from squall.programs.snapshot import resolve_ref, snapshot_folder, snapshot_ref
from squall.programs.spec import ProgramError


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.lstat().st_mode)


@pytest.fixture
def private(tmp_path: Path) -> Path:
    """A folder only its owner may enter (a home directory of mode 0700), with a private script."""
    folder = tmp_path / "home"
    (folder / "pkg").mkdir(parents=True)
    (folder / "train.py").write_text("print('hello')\n")
    (folder / "train.py").chmod(0o600)
    (folder / "run.sh").write_text("#!/bin/sh\n")
    (folder / "run.sh").chmod(0o700)
    (folder / "pkg" / "model.py").write_text("X = 1\n")
    (folder / "pkg" / "model.py").chmod(0o600)
    (folder / "pkg").chmod(0o700)
    folder.chmod(0o700)
    return folder


def test_a_private_folder_is_copied_readable_by_everyone_and_left_as_it_was(private: Path, tmp_path: Path) -> None:
    before = {p: _mode(p) for p in [private, *private.rglob("*")]}
    snap = snapshot_folder(private, tmp_path / "snap")
    copy = Path(snap.path)
    assert {p: _mode(p) for p in [private, *private.rglob("*")]} == before  # the user's folder is not opened
    assert _mode(copy) == 0o755 and _mode(copy / "pkg") == 0o755
    assert _mode(copy / "train.py") == 0o644 and _mode(copy / "pkg" / "model.py") == 0o644
    assert _mode(copy / "run.sh") == 0o755  # an executable stays executable
    assert (copy / "pkg" / "model.py").read_text() == "X = 1\n"
    assert (snap.files, snap.size) == (3, len("print('hello')\n") + len("#!/bin/sh\n") + len("X = 1\n"))


def test_the_digest_says_what_ran(private: Path, tmp_path: Path) -> None:
    first = snapshot_folder(private, tmp_path / "a").digest
    assert snapshot_folder(private, tmp_path / "b").digest == first  # the same folder, the same digest
    private.chmod(0o755)
    (private / "pkg" / "model.py").chmod(0o644)
    (private / "pkg" / "model.py").write_text("X = 2\n")
    assert snapshot_folder(private, tmp_path / "c").digest != first


def test_caches_version_control_and_excluded_files_are_left_out(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    for rel in ("train.py", ".git/HEAD", "__pycache__/x.pyc", "data/big.bin", "data/keep.txt", ".venv/bin/python",
                "notes/a.log"):
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        (folder / rel).write_text(rel)
    snap = snapshot_folder(folder, tmp_path / "snap", excludes=("*.bin", "notes"))
    kept = sorted(str(p.relative_to(snap.path)) for p in Path(snap.path).rglob("*") if p.is_file())
    assert kept == ["data/keep.txt", "train.py"]


def test_a_folder_over_the_limit_is_refused_naming_what_is_large_and_how_to_leave_it_out(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    (folder / "checkpoints").mkdir(parents=True)
    (folder / "checkpoints" / "model.pt").write_bytes(b"\0" * 3_000_000)
    (folder / "train.py").write_text("x")
    with pytest.raises(ProgramError, match=r"--workdir: .* holds 3 MB, more than the 1 MB .*largest: checkpoints "
                                           r"\(3 MB\).*--exclude PATTERN"):
        snapshot_folder(folder, tmp_path / "snap", limit_bytes=1_000_000)
    assert not (tmp_path / "snap").exists()  # nothing half-copied
    assert snapshot_folder(folder, tmp_path / "snap", limit_bytes=1_000_000, excludes=("checkpoints",)).files == 1


def test_a_symlink_is_copied_as_a_link(tmp_path: Path) -> None:
    folder = tmp_path / "src"
    folder.mkdir()
    (folder / "real.py").write_text("x")
    os.symlink("real.py", folder / "alias.py")
    snap = Path(snapshot_folder(folder, tmp_path / "snap").path)
    assert (snap / "alias.py").is_symlink() and os.readlink(snap / "alias.py") == "real.py"


def _git(repo: Path, *args: str) -> str:
    return subprocess.run(["git", "-c", "user.email=t@example.com", "-c", "user.name=t", *args], cwd=repo, check=True,
                          capture_output=True, text=True).stdout.strip()


def test_a_folder_as_committed_at_a_ref_is_copied_without_touching_the_repository(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    (repo / "project").mkdir(parents=True)
    _git(repo, "init", "-q")
    (repo / "project" / "train.py").write_text("SLEEP = 0\n")
    _git(repo, "add", ".")
    _git(repo, "commit", "-q", "-m", "fast")
    (repo / "project" / "train.py").write_text("SLEEP = 1\n")  # uncommitted: the candidate
    ref = resolve_ref("HEAD", repo / "project")
    assert ref.folder == "project" and len(ref.commit) == 40
    snap = snapshot_ref(ref, tmp_path / "base")
    assert (Path(snap.path) / "train.py").read_text() == "SLEEP = 0\n"
    assert snap.source.startswith("HEAD (") and snap.source.endswith(":project")
    assert _git(repo, "worktree", "list").count("\n") == 0  # no worktree left in the user's repository
    assert _git(repo, "status", "--porcelain") == "M project/train.py"  # the working tree as it was


@pytest.mark.parametrize("ref", ["no-such-branch", "HEAD~5"])
def test_a_ref_that_names_no_commit_is_a_usage_error(tmp_path: Path, ref: str) -> None:
    _git(tmp_path, "init", "-q")
    (tmp_path / "a").write_text("a")
    _git(tmp_path, "add", ".")
    _git(tmp_path, "commit", "-q", "-m", "one")
    with pytest.raises(ProgramError, match=rf"--ref: '{ref}' names no commit in the repository at"):
        resolve_ref(ref, tmp_path)


def test_a_folder_outside_any_repository_is_a_usage_error(tmp_path: Path) -> None:
    with pytest.raises(ProgramError, match=r"--ref: .* is not inside a git repository"):
        resolve_ref("HEAD", tmp_path)


def test_a_report_inside_the_program_folder_is_never_copied_into_the_next_snapshot(tmp_path: Path) -> None:
    from squall.experiment.session import Session
    from squall.programs.spec import program_from_args

    (tmp_path / "train.py").write_text("x")
    (tmp_path / "results" / "compare" / "snapshots" / "old").mkdir(parents=True)
    (tmp_path / "results" / "compare" / "snapshots" / "old" / "train.py").write_text("x")
    program = program_from_args(["python", "train.py"], cwd=tmp_path)
    session = Session(snapshots=tmp_path / "results" / "compare" / "snapshots")
    try:
        snap = session.snapshot(program)
        assert sorted(p.name for p in Path(snap.path).rglob("*")) == ["train.py"]
    finally:
        session.close()
