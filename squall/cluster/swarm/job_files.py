"""A job's files read on a worker's node and written into the harness's copy of its folder elsewhere.

A worker's job folder is on its node; when that node is another machine, the node agent reads the
files (:func:`read_job`) and the harness writes them into its mirror of the folder
(:func:`write_job`), as each job ends and, for a program's ranks, every few seconds while they run
(their stdout and stderr growing is how the hang watch sees progress).

Which files: the job's result, metrics and log; a program's ``stdout.txt``, ``stderr.txt`` and
``program.json``, in the job folder and in each local rank's ``local<L>/``; with ``every``, also the
files under their ``out/`` (base64: they may be binary). An answer holds at most
:data:`MAX_ANSWER` bytes of file data: a text file longer than :data:`MAX_TEXT` keeps its end (the
last records and the traceback matter), and ``out/`` files that do not fit are named in
``left_out`` rather than sent.

Paths in an answer are checked again where they are written (:func:`~.folders.safe_relative`).
"""

from __future__ import annotations

import base64
import contextlib
import re
from pathlib import Path
from typing import Any

from squall.cluster.swarm.folders import FolderError, safe_relative

TEXT_FILES = ("result.json", "metrics.jsonl", "log.txt", "stdout.txt", "stderr.txt", "program.json")
LOCAL_DIR = re.compile(r"^local[0-9]{1,4}$")  # a local rank's folder (squall.worker.local_ranks.LOCAL_DIR)
OUT_DIR = "out"
MAX_TEXT = 4 << 20  # per text file in one answer
MAX_ANSWER = 10 << 20  # file data in one answer (base64 and JSON stay under wire.MAX_LINE)


def _tail(data: bytes) -> bytes:
    return data if len(data) <= MAX_TEXT else data[-MAX_TEXT:].split(b"\n", 1)[-1]


def read_job(folder: Path, *, every: bool = False) -> dict[str, Any]:
    """``{"files": {path: text}, "blobs": {path: base64}, "left_out": [path]}`` of the job folder ``folder``."""
    roots = [Path()]
    with contextlib.suppress(OSError):
        roots += sorted(Path(p.name) for p in folder.iterdir() if p.is_dir() and LOCAL_DIR.match(p.name))
    files: dict[str, str] = {}
    blobs: dict[str, str] = {}
    left_out: list[str] = []
    used = 0
    for root in roots:
        for name in TEXT_FILES:
            with contextlib.suppress(OSError):
                data = _tail((folder / root / name).read_bytes())
                if used + len(data) > MAX_ANSWER:
                    left_out.append((root / name).as_posix())
                    continue
                used += len(data)
                files[(root / name).as_posix()] = data.decode(errors="replace")
    if every:
        for root in roots:
            out = folder / root / OUT_DIR
            if not out.is_dir() or out.is_symlink():
                continue
            for path in sorted(p for p in out.rglob("*") if p.is_file() and not p.is_symlink()):
                rel = path.relative_to(folder).as_posix()
                size = path.stat().st_size
                if used + size > MAX_ANSWER:
                    left_out.append(rel)
                    continue
                used += size
                blobs[rel] = base64.b64encode(path.read_bytes()).decode()
    return {"files": files, "blobs": blobs, "left_out": left_out}


def _allowed(rel: object) -> bool:
    """Whether ``rel`` names a file :func:`read_job` reads: a text file, under ``out/`` or a local rank's folder."""
    if not isinstance(rel, str):
        return False
    first = rel.split("/", 1)[0]
    return first in (*TEXT_FILES, OUT_DIR) or bool(LOCAL_DIR.match(first))


def write_job(answer: dict[str, Any], folder: Path) -> list[str]:
    """Write what :func:`read_job` read into ``folder`` (here); a file is rewritten only when it changed, so
    its modification time says when it last grew. Returns the paths left out on the node."""
    folder.mkdir(parents=True, exist_ok=True)
    items: list[tuple[str, bytes]] = [(k, str(v).encode()) for k, v in dict(answer.get("files") or {}).items()]
    items += [(k, base64.b64decode(str(v))) for k, v in dict(answer.get("blobs") or {}).items()]
    for rel, data in items:
        if not _allowed(rel):
            raise FolderError(f"a job's file {rel!r:.120} is not one the harness copies")
        dest = folder.joinpath(*safe_relative(rel).parts)
        with contextlib.suppress(OSError):
            if dest.stat().st_size == len(data) and dest.read_bytes() == data:
                continue
        dest.parent.mkdir(parents=True, exist_ok=True)
        dest.write_bytes(data)
    return [str(p) for p in answer.get("left_out") or []]
