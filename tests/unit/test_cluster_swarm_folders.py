"""Folders copied to swarm nodes through the agents, and job files copied back: planning, paths, round trips."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import pytest

from squall.cluster.swarm import folders
from squall.cluster.swarm.folders import FolderError, Piece, is_copied, plan_pieces, safe_relative
from squall.cluster.swarm.job_files import read_job, write_job
from squall.experiment.job_mirror import JobMirror, sync_of


def test_pieces_fill_each_request_and_split_large_files() -> None:
    plan = plan_pieces([("a", 3), ("big", 10), ("empty", 0), ("z", 2)], chunk=4)
    assert plan == [
        [Piece("a", 0, 3, 3), Piece("big", 0, 1, 10)],
        [Piece("big", 1, 4, 10)],
        [Piece("big", 5, 4, 10)],
        [Piece("big", 9, 1, 10), Piece("empty", 0, 0, 0), Piece("z", 0, 2, 2)],
    ]
    assert all(sum(p.size for p in request) <= 4 for request in plan)
    assert plan_pieces([]) == []
    with pytest.raises(FolderError):
        plan_pieces([("a", 1)], chunk=0)


@pytest.mark.parametrize("bad", ["", "/etc/passwd", "../x", "a/../../x", "a//b", "./a", "a/.", "a\\b", "a\0b", 3, None])
def test_paths_that_could_leave_the_copy_are_refused(bad: object) -> None:
    with pytest.raises(FolderError):
        safe_relative(bad)


def test_only_read_only_folders_outside_the_checkout_are_copied(tmp_path: Path) -> None:
    repo = tmp_path / "repo"
    assert is_copied(str(tmp_path / "snapshot"), True, repo)
    assert not is_copied(str(tmp_path / "snapshot"), False, repo)  # a writable mount cannot be a copy
    assert not is_copied(str(repo), True, repo) and not is_copied(str(repo / "docs" / "examples"), True, repo)
    assert is_copied(str(tmp_path / "repo-other"), True, repo)


def test_a_folder_arrives_whole_through_json(tmp_path: Path) -> None:
    src = tmp_path / "src"
    (src / "pkg" / "empty").mkdir(parents=True)
    (src / "train.py").write_text("print('hi')\n")
    (src / "pkg" / "weights.bin").write_bytes(bytes(range(256)) * 40)  # 10 240 bytes: split across requests of 4 096
    (src / "nothing.txt").write_bytes(b"")
    (src / "link.py").symlink_to(src / "train.py")  # copied as a file, never as a link
    dest = folders.copy_dir(tmp_path / "node-run", 0)
    dest.mkdir(parents=True)
    requests = list(folders.requests_for(src, chunk=4096))
    assert len(requests) == 3 and requests[0][0] == ["pkg", "pkg/empty"]  # 10 264 bytes in all
    for dirs, pieces in requests:
        wire = json.loads(json.dumps({"dirs": dirs, "pieces": pieces}))  # exactly what crosses
        folders.make_dirs(dest, wire["dirs"])
        for piece in wire["pieces"]:
            folders.write_piece(dest, piece)
    assert (dest / "pkg" / "weights.bin").read_bytes() == (src / "pkg" / "weights.bin").read_bytes()
    assert (dest / "train.py").read_text() == "print('hi')\n" and (dest / "nothing.txt").read_bytes() == b""
    assert (dest / "link.py").is_file() and not (dest / "link.py").is_symlink()
    assert (dest / "pkg" / "empty").is_dir()


def test_malformed_pieces_are_refused(tmp_path: Path) -> None:
    good = {"path": "a", "offset": 0, "total": 2, "data": "aGk="}
    for bad in ({**good, "path": "../a"}, {**good, "offset": -1}, {**good, "total": 1}, {**good, "data": "!!"},
                {**good, "extra": 1}, {**good, "offset": True}, "a"):
        with pytest.raises(FolderError):
            folders.write_piece(tmp_path, bad)
    assert not (tmp_path / "a").exists()
    with pytest.raises(FolderError):
        folders.copy_dir(tmp_path, folders.MAX_MOUNTS)


def test_a_job_folder_is_mirrored_and_unchanged_files_are_not_rewritten(tmp_path: Path) -> None:
    job = tmp_path / "node" / "jobs" / "j00001"
    (job / "local1" / "out").mkdir(parents=True)
    (job / "out").mkdir()
    (job / "stdout.txt").write_text("step 1 loss 2.0\n")
    (job / "program.json").write_text('{"state": "exited"}')
    (job / "local1" / "stderr.txt").write_text("warning\n")
    (job / "local1" / "out" / "ckpt.bin").write_bytes(b"\x00\xff" * 8)
    (job / "other.txt").write_text("not copied")
    here = tmp_path / "here" / "jobs" / "j00001"
    lines = read_job(job)
    assert set(lines["files"]) == {"stdout.txt", "program.json", "local1/stderr.txt"} and not lines["blobs"]
    write_job(json.loads(json.dumps(read_job(job, every=True))), here)
    assert (here / "local1" / "out" / "ckpt.bin").read_bytes() == b"\x00\xff" * 8
    assert (here / "stdout.txt").read_text() == "step 1 loss 2.0\n" and not (here / "other.txt").exists()
    before = (here / "stdout.txt").stat().st_mtime_ns
    write_job(read_job(job), here)
    assert (here / "stdout.txt").stat().st_mtime_ns == before  # unchanged: its time still says when it grew
    with pytest.raises(FolderError):
        write_job({"files": {"../escape.txt": "x"}}, here)
    with pytest.raises(FolderError):
        write_job({"files": {"stdout.txt/../../escape": "x"}}, here)


def test_the_mirror_syncs_each_running_job_until_stopped() -> None:
    seen: list[tuple[int, str]] = []
    done = threading.Event()

    def sync(node: int, job: str) -> None:
        seen.append((node, job))
        if len(seen) >= 4:
            done.set()
        if node == 1:
            raise OSError("node gone")  # a failed copy is a late line, not a failed run

    mirror = JobMirror(sync, lambda: [(0, "j1"), (1, "j1")], interval=0.01).start()
    assert done.wait(5)
    mirror.stop()
    assert (0, "j1") in seen and mirror.errors and "node gone" in mirror.errors[0]
    assert sync_of(object()) is None


def test_a_program_image_context_is_found_by_its_tag_only(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from squall.cluster.errors import ImageError
    from squall.cluster.program_image import cached_context, context_dir

    monkeypatch.setenv("SQUALL_CACHE_DIR", str(tmp_path))
    folder = context_dir("squall-program:abc123")
    assert folder == tmp_path / "program-context" / "abc123"
    assert cached_context("squall-program:abc123") is None  # never kept
    (folder / "wheels").mkdir(parents=True)
    (folder / "Dockerfile").write_text("ARG BASE\nFROM ${BASE}\n")
    assert cached_context("squall-program:abc123") == folder
    assert cached_context("squall-worker:abc123") is None and cached_context("squall-program:../x") is None
    with pytest.raises(ImageError):
        context_dir("squall-program:../../etc")


def test_the_node_agent_writes_pieces_and_builds_only_program_images(tmp_path: Path) -> None:
    import os

    from squall.cluster.swarm.node_agent import Agent, Config

    agent = Agent(Config("r1", 7000, "t" * 32, "svc", "net", tmp_path, 2, (os.getuid(), os.getgid())), docker=None)
    try:
        src = tmp_path / "src"
        src.mkdir()
        (src / "train.py").write_text("print(1)\n")
        for dirs, pieces in folders.requests_for(src):
            answer = agent.handle({"cmd": "put_files", "mount": 1, "dirs": dirs, "pieces": pieces})
            assert answer == {"ok": True, "written": 1}
        assert (folders.copy_dir(tmp_path, 1) / "train.py").read_text() == "print(1)\n"
        with pytest.raises(FolderError):
            agent.handle({"cmd": "put_files", "mount": 0, "dirs": ["../out"], "pieces": []})
        with pytest.raises(ValueError, match="only a program image"):
            agent.handle({"cmd": "build", "tag": "evil:latest", "base": "squall-worker:abc123"})
        with pytest.raises(ValueError, match="only a program image"):
            agent.handle({"cmd": "build", "tag": "squall-program:abc123", "base": "debian:12"})
    finally:
        agent.close()
