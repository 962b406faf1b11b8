"""A host folder copied to every swarm node through the node agents (a program's snapshot, for one).

On one machine a worker bind-mounts a folder of the host; a worker on another machine cannot, so every
read-only mount (:class:`~squall.cluster.spec.Mount`) outside the checkout (:func:`is_copied`: the
checkout is at the same path on every node, as the swarm engine requires) is sent to each node's agent
before the workers start, and the workers bind-mount the node's copy. The agents speak token-checked JSON lines
(:mod:`.wire`), so a folder crosses as :class:`Piece` records, file contents in base64, in requests of
at most :data:`CHUNK_BYTES` of file data each; a file larger than that crosses in several pieces, each
written at its offset.

Nothing from the network is trusted: :func:`safe_relative` refuses absolute paths, ``..`` and empty
parts, so a piece can only land inside the copy's own folder (:func:`write_piece`). Only regular files
and folders are copied (a symbolic link's target is copied as a file, never as a link).

:func:`plan_pieces` is the pure planning: which bytes of which file go in which request.
"""

from __future__ import annotations

import base64
import os
import stat
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Any

CHUNK_BYTES = 4 << 20  # file data per request: base64 makes it about 5.3 MB, well under wire.MAX_LINE
COPIES_DIR = "mounts"  # <run dir>/mounts/m<k> on every node holds the copy of the run's k-th copied mount
MAX_MOUNTS = 16  # copied mounts per run
IMAGE_CONTEXT = "image-context"  # <run dir>/image-context on a node: a program image's build context


class FolderError(ValueError):
    """A folder cannot be copied, or a piece of one is malformed; says which and why."""


@dataclass(frozen=True)
class Piece:
    """``size`` bytes of file ``path`` (relative, POSIX) from ``offset``; ``total``: the file's whole size."""

    path: str
    offset: int
    size: int
    total: int


def is_copied(source: str, read_only: bool, shared: Path) -> bool:
    """Whether a mount of ``source`` is copied to the nodes: read-only and outside ``shared`` (pure)."""
    path = Path(source)
    return read_only and path != shared and shared not in path.parents


def safe_relative(path: Any) -> PurePosixPath:
    """``path`` as a relative POSIX path inside its folder; :class:`FolderError` for anything that could leave it."""
    if not isinstance(path, str) or not path or "\0" in path or "\\" in path:
        raise FolderError(f"not a relative file path: {path!r:.120}")
    pure = PurePosixPath(path)
    if pure.is_absolute() or any(part in ("", ".", "..") for part in path.split("/")):
        raise FolderError(f"path {path!r:.120} leaves its folder or is not normalised")
    return pure


def image_context_dir(run_dir: Path | str) -> Path:
    """Where a node holds the build context of an image it lacks (copied like a mount, then built there)."""
    return Path(run_dir) / IMAGE_CONTEXT


def copy_dir(run_dir: Path | str, index: int) -> Path:
    """Where the copy of the run's ``index``-th copied mount is on a node."""
    if not 0 <= index < MAX_MOUNTS:
        raise FolderError(f"copied mount {index} outside 0..{MAX_MOUNTS - 1}")
    return Path(run_dir) / COPIES_DIR / f"m{index}"


def listing(folder: Path) -> tuple[list[str], list[tuple[str, int]]]:
    """The sub-folders and the (file, size) of ``folder``, relative, sorted; what is neither is left out."""
    if not folder.is_dir():
        raise FolderError(f"{folder} is not a folder: it cannot be copied to the swarm's nodes")
    dirs: list[str] = []
    files: list[tuple[str, int]] = []
    for root, subdirs, names in os.walk(folder):
        base = Path(root)
        subdirs.sort()
        for d in subdirs:
            if not (base / d).is_symlink():
                dirs.append((base / d).relative_to(folder).as_posix())
        for name in sorted(names):
            path = base / name
            try:
                st = path.stat()
            except OSError:  # a dangling link
                continue
            if stat.S_ISREG(st.st_mode):
                files.append((path.relative_to(folder).as_posix(), st.st_size))
    return sorted(dirs), sorted(files)


def plan_pieces(files: Sequence[tuple[str, int]], chunk: int = CHUNK_BYTES) -> list[list[Piece]]:
    """The requests that carry ``files`` ((path, size), in order): each at most ``chunk`` bytes of data
    (pure). An empty file is one piece of size 0; a file larger than ``chunk`` is split at its offsets."""
    if chunk <= 0:
        raise FolderError(f"chunk of {chunk} bytes: must be > 0")
    requests: list[list[Piece]] = []
    current: list[Piece] = []
    room = chunk
    for path, total in files:
        offset = 0
        while True:
            if room == 0:
                requests.append(current)
                current, room = [], chunk
            size = min(total - offset, room)
            current.append(Piece(path, offset, size, total))
            room -= size
            offset += size
            if offset >= total:
                break
    if current:
        requests.append(current)
    return requests


def encode(folder: Path, pieces: Sequence[Piece]) -> list[dict[str, Any]]:
    """The pieces as JSON values, each with its bytes read from ``folder`` (base64)."""
    out = []
    for p in pieces:
        with (folder / p.path).open("rb") as fh:
            fh.seek(p.offset)
            data = fh.read(p.size)
        if len(data) != p.size:
            raise FolderError(f"{folder / p.path} changed while it was copied (read {len(data)} of {p.size} bytes "
                              f"at {p.offset})")
        out.append({"path": p.path, "offset": p.offset, "total": p.total, "data": base64.b64encode(data).decode()})
    return out


def decode(value: Any) -> tuple[PurePosixPath, int, int, bytes]:
    """One piece as :func:`encode` wrote it: (path, offset, total, data); :class:`FolderError` on anything else."""
    if not isinstance(value, dict) or set(value) != {"path", "offset", "total", "data"}:
        raise FolderError("a piece is an object with exactly path, offset, total and data")
    path = safe_relative(value["path"])
    offset, total = value["offset"], value["total"]
    if any(isinstance(v, bool) or not isinstance(v, int) or v < 0 for v in (offset, total)):
        raise FolderError(f"piece {path}: offset and total must be integers >= 0")
    if not isinstance(value["data"], str):
        raise FolderError(f"piece {path}: data must be base64 text")
    try:
        data = base64.b64decode(value["data"], validate=True)
    except ValueError as exc:
        raise FolderError(f"piece {path}: data is not base64: {exc}") from exc
    if offset + len(data) > total:
        raise FolderError(f"piece {path}: {len(data)} bytes at {offset} run past the file's {total}")
    return path, offset, total, data


def write_piece(root: Path, value: Any) -> None:
    """Write one piece into ``root`` (the copy's folder); the file gets its whole size on its first piece."""
    path, offset, total, data = decode(value)
    dest = root.joinpath(*path.parts)
    dest.parent.mkdir(parents=True, exist_ok=True)
    if dest.is_symlink():
        raise FolderError(f"piece {path}: the copy holds a link there")
    with dest.open("r+b" if offset else "wb") as fh:
        if not offset:
            fh.truncate(total)
        fh.seek(offset)
        fh.write(data)
    dest.chmod(0o644)


def make_dirs(root: Path, dirs: Any) -> None:
    """The copy's sub-folders (an empty one holds no piece)."""
    if not isinstance(dirs, list):
        raise FolderError("dirs must be a list of relative paths")
    for d in dirs:
        root.joinpath(*safe_relative(d).parts).mkdir(parents=True, exist_ok=True)


def requests_for(folder: Path, chunk: int = CHUNK_BYTES) -> Iterator[tuple[list[str], list[dict[str, Any]]]]:
    """(sub-folders, encoded pieces) of each request that copies ``folder``: the sub-folders go with the first."""
    dirs, files = listing(folder)
    planned = plan_pieces(files, chunk) or [[]]
    for k, pieces in enumerate(planned):
        yield (dirs if k == 0 else []), encode(folder, pieces)
