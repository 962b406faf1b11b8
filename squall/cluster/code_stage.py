"""A third party's protocol code for the containers: a folder to mount, never a whole site-packages.

A protocol that lives outside Squall reaches the containers as a read-only mount on their
``PYTHONPATH`` (:class:`squall.experiment.lab.Lab`'s ``code``). A folder of the user's own (a checkout
on the host's ``sys.path``, the source of an editable install) is mounted as it is, so an edit needs
no restart. Code installed *into* a site-packages folder is copied instead (:func:`stage`): mounting
that folder would put every package of the host's environment on the containers' ``PYTHONPATH``,
ahead of the image's own (a host torch, compiled extensions of another Python).

:func:`stage` copies packages, single modules and a distribution's metadata folder (its entry
points, so the catalog inside the containers finds the same declarations) into
``<cache>/ext/<digest>/``, where the digest covers their names, sizes and modification times: an
unchanged package is staged once, an edited one again.
"""

from __future__ import annotations

import hashlib
import logging
import shutil
import site
import sysconfig
import tempfile
from collections.abc import Sequence
from pathlib import Path

from squall import assets

logger = logging.getLogger(__name__)

IGNORED = ("__pycache__", "*.pyc")


def site_dirs() -> frozenset[Path]:
    """The folders installers write packages into, for this interpreter (site, user site, sysconfig's)."""
    found: list[str] = [*site.getsitepackages(), site.getusersitepackages()]
    paths = sysconfig.get_paths()
    found += [paths["purelib"], paths["platlib"]]
    return frozenset(Path(p).resolve() for p in found if p)


def is_site_dir(folder: Path) -> bool:
    """Whether ``folder`` is a site-packages folder of this interpreter (mounting it would bring every package)."""
    return folder.resolve() in site_dirs()


def _digest(sources: Sequence[Path]) -> str:
    h = hashlib.sha256()
    for source in sources:
        h.update(f"{source.name}\0".encode())
        files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        for path in files:
            if "__pycache__" in path.parts or path.suffix == ".pyc":
                continue
            stat = path.stat()
            h.update(f"{path.relative_to(source.parent)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def stage(sources: Sequence[Path]) -> Path:
    """A folder holding copies of ``sources`` (packages, module files, ``*.dist-info`` folders) side by side.

    :raises FileNotFoundError: a source does not exist.
    :raises ValueError: two sources share a name (they would land on the same path).
    """
    names = [s.name for s in sources]
    if len(set(names)) != len(names):
        raise ValueError(f"cannot stage {[str(s) for s in sources]}: two of them are called the same")
    for source in sources:
        if not source.exists():
            raise FileNotFoundError(f"cannot stage {source} for the containers: it does not exist")
    staged = assets.cache_dir() / "ext" / _digest(sources)
    if staged.is_dir():
        return staged
    staged.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".staging-", dir=staged.parent))
    try:
        for source in sources:
            if source.is_dir():
                shutil.copytree(source, tmp / source.name, ignore=shutil.ignore_patterns(*IGNORED))
            else:
                shutil.copy2(source, tmp / source.name)
        tmp.chmod(0o755)  # read by the containers' users, whoever owns the cache
        try:
            tmp.rename(staged)
        except OSError:  # another process staged the same content first
            if not staged.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("staged %s for the containers in %s", ", ".join(names), staged)
    return staged
