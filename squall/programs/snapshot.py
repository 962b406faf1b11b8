"""A read-only snapshot of a program's folder: what the containers run, kept with the results.

A user's program runs as an unprivileged user in the containers, but its folder is often private
(a home directory of mode 0700). Rather than ask the user to open it to every account on the
machine, Squall copies the folder (as the user who started Squall) into a snapshot that everyone
may read, and mounts the snapshot read-only. The snapshot is also the record of exactly what ran:
it stays with the results, with a digest of its contents, so the run can be reproduced.

A folder as committed at a git ref (``squall compare --ref``) is snapshotted the same way, from
``git archive``: nothing is written into the user's repository.

Pure file operations; errors are :class:`~squall.programs.spec.ProgramError` naming the folder, the
limit and how to leave files out.
"""

from __future__ import annotations

import fnmatch
import hashlib
import io
import os
import shutil
import stat
import subprocess
import tarfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path

from squall.programs.spec import ProgramError

#: Left out of every snapshot: version control, caches and virtual environments no program reads.
DEFAULT_EXCLUDES = (".git", "__pycache__", "*.pyc", ".venv", "venv", ".mypy_cache", ".pytest_cache", ".ruff_cache",
                    ".tox", ".nox", "node_modules")
#: The largest folder Squall copies without being told what to leave out.
DEFAULT_LIMIT_BYTES = 256 * 1024 * 1024
#: What ``git archive`` may produce for one ref before Squall refuses it.
GIT_TIMEOUT_S = 120.0


@dataclass(frozen=True)
class Snapshot:
    """A folder copied for the containers."""

    source: str  # the folder (or "REF:folder") it was made from
    path: str  # the copy: readable by everyone, mounted read-only
    files: int  # how many files it holds
    size: int  # their bytes
    digest: str  # sha256 over every file's relative path and contents, in path order

    def to_json(self) -> dict[str, object]:
        return {"source": self.source, "path": self.path, "files": self.files, "size": self.size,
                "digest": self.digest}


def _excluded(rel: str, name: str, excludes: Sequence[str]) -> bool:
    return any(fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(rel, pattern) for pattern in excludes)


def _walk(folder: Path, excludes: Sequence[str]) -> Iterator[tuple[str, Path]]:
    """``(relative path, path)`` of every file and symlink under ``folder`` that is not excluded, sorted."""
    for root, dirs, files in os.walk(folder):
        here = Path(root)
        rel_root = here.relative_to(folder)
        dirs[:] = sorted(d for d in dirs if not _excluded(str(rel_root / d), d, excludes)
                         and not (here / d).is_symlink())
        links = [d for d in os.listdir(here) if (here / d).is_symlink() and (here / d).is_dir()]
        for name in sorted([*files, *links]):
            rel = str(rel_root / name) if str(rel_root) != "." else name
            if not _excluded(rel, name, excludes):
                yield rel, here / name


def snapshot_folder(folder: str | Path, dest: str | Path, *, excludes: Sequence[str] = (),
                    limit_bytes: int = DEFAULT_LIMIT_BYTES, flag: str = "--workdir") -> Snapshot:
    """Copy ``folder`` into ``dest`` (created; must not exist), readable by everyone.

    :param excludes: glob patterns of names or relative paths to leave out, besides :data:`DEFAULT_EXCLUDES`.
    :raises ProgramError: the folder is not one, or it holds more than ``limit_bytes`` (the message names the
        largest entries and the flag that leaves them out).
    """
    src = Path(folder)
    if not src.is_dir():
        raise ProgramError(f"{flag}: {src} is not a directory")
    patterns = (*DEFAULT_EXCLUDES, *excludes)
    entries = list(_walk(src, patterns))
    sizes = {rel: path.lstat().st_size for rel, path in entries if not path.is_symlink()}
    total = sum(sizes.values())
    if total > limit_bytes:
        tops: dict[str, int] = {}
        for rel, size in sizes.items():
            top = rel.split(os.sep, 1)[0]
            tops[top] = tops.get(top, 0) + size
        largest = ", ".join(f"{name} ({size / 1e6:.0f} MB)" for name, size in
                            sorted(tops.items(), key=lambda kv: -kv[1])[:5])
        raise ProgramError(f"{flag}: {src} holds {total / 1e6:.0f} MB, more than the {limit_bytes / 1e6:.0f} MB Squall "
                           f"copies for the containers; largest: {largest}. Leave files out with --exclude PATTERN "
                           "(repeatable), or point --workdir at a smaller folder")
    out = Path(dest)
    out.mkdir(parents=True)
    digest = hashlib.sha256()
    for rel, path in entries:
        target = out / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        digest.update(rel.encode() + b"\0")
        if path.is_symlink():
            link = os.readlink(path)
            target.symlink_to(link)
            digest.update(b"->" + link.encode() + b"\0")
            continue
        shutil.copyfile(path, target)
        with target.open("rb") as f:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        executable = path.stat().st_mode & stat.S_IXUSR
        target.chmod(0o755 if executable else 0o644)
    _open_folders(out)
    return Snapshot(str(src), str(out), len(entries), total, digest.hexdigest())


def _open_folders(root: Path) -> None:
    """Every folder of the snapshot readable and searchable by everyone (the program runs as 'nobody')."""
    root.chmod(0o755)
    for here, dirs, _ in os.walk(root):
        for d in dirs:
            path = Path(here) / d
            if not path.is_symlink():
                path.chmod(0o755)


def _git(args: Sequence[str], *, cwd: Path, flag: str) -> bytes:
    try:
        done = subprocess.run(["git", *args], cwd=cwd, capture_output=True, timeout=GIT_TIMEOUT_S, check=False)
    except FileNotFoundError:
        raise ProgramError(f"{flag}: git is not installed") from None
    except subprocess.TimeoutExpired:
        raise ProgramError(f"{flag}: 'git {' '.join(args)}' took more than {GIT_TIMEOUT_S:.0f} s") from None
    if done.returncode != 0:
        why = done.stderr.decode(errors="replace").strip().splitlines()
        raise ProgramError(f"{flag}: 'git {' '.join(args)}' in {cwd} failed: {why[-1] if why else done.returncode}")
    return done.stdout


@dataclass(frozen=True)
class Ref:
    """A git ref resolved in the repository that holds a folder."""

    ref: str  # as the user gave it, e.g. origin/main
    commit: str  # the full commit id it names
    top: str  # the repository's top folder
    folder: str  # the folder's path inside the repository ('' for the top)


def resolve_ref(ref: str, folder: str | Path, *, flag: str = "--ref") -> Ref:
    """The commit ``ref`` names in the repository holding ``folder``.

    :raises ProgramError: not a git repository, or no such commit (before anything starts).
    """
    where = Path(folder).resolve()
    try:
        top = Path(_git(["rev-parse", "--show-toplevel"], cwd=where, flag=flag).decode().strip())
    except ProgramError as exc:
        raise ProgramError(f"{flag}: {where} is not inside a git repository ({exc})") from None
    try:
        commit = _git(["rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=where, flag=flag).decode().strip()
    except ProgramError:
        raise ProgramError(f"{flag}: {ref!r} names no commit in the repository at {top} (try 'git fetch', or a "
                           "branch, tag or commit id)") from None
    rel = where.relative_to(top)
    return Ref(ref, commit, str(top), "" if str(rel) == "." else str(rel))


def snapshot_ref(ref: Ref, dest: str | Path, *, excludes: Sequence[str] = (),
                 limit_bytes: int = DEFAULT_LIMIT_BYTES, flag: str = "--ref") -> Snapshot:
    """The folder as committed at ``ref``, extracted with ``git archive`` into ``dest`` (then as
    :func:`snapshot_folder`)."""
    treeish = f"{ref.commit}:{ref.folder}" if ref.folder else ref.commit
    data = _git(["archive", "--format=tar", treeish], cwd=Path(ref.top), flag=flag)
    staging = Path(f"{dest}.extract")
    staging.mkdir(parents=True)
    try:
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            tar.extractall(staging, filter="data")  # no absolute paths, no links out of the folder
        made = snapshot_folder(staging, dest, excludes=excludes, limit_bytes=limit_bytes, flag=flag)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return Snapshot(f"{ref.ref} ({ref.commit[:12]}):{ref.folder or '.'}", made.path, made.files, made.size,
                    made.digest)
