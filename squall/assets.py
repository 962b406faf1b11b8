"""Where Squall's assets are: network profiles, the worker image recipe, claims and matrices.

This module is the one place that locates them. Two layouts, one answer:

* **installed from a wheel**: the assets are package data under ``squall/_assets/`` (``setup.py``
  copies the checkout's top-level folders there when it builds the wheel), found through the
  package with :mod:`importlib.resources`, wherever pip put it;
* **a checkout** (``make venv``'s editable install, or ``PYTHONPATH=.``): the repository's own
  top-level ``netem_profiles/``, ``containers/``, ``matrices/`` and ``claims.yaml``, so editing
  them needs no reinstall.

Path functions (:func:`profiles_dir`, :func:`containers_dir`, ...) never raise, so modules can
keep them as constants; :func:`require` raises :class:`AssetError` (the CLI's exit code 3: the
installation is broken, not the user's input) naming the asset and every place it looked.

Squall's code is bind-mounted into the worker containers (``/squall/src``). From a checkout that is
the repository root; from a wheel it is a copy of the installed ``squall`` package (without its
assets) in the cache (:func:`code_root`), because mounting ``site-packages`` itself would put the
host's torch and numpy ahead of the image's on the containers' ``PYTHONPATH``.

Only the standard library is imported here: every host layer may use this module.
"""

from __future__ import annotations

import hashlib
import importlib.resources
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Final

logger = logging.getLogger(__name__)

#: Folders and files of the checkout that the wheel carries (setup.py copies the same list).
ASSET_DIRS: Final = ("netem_profiles", "containers", "matrices")
ASSET_FILES: Final = ("claims.yaml",)
#: Where the wheel holds them, inside the ``squall`` package.
PACKAGED_DIR: Final = "_assets"
#: Never packaged: the wheels downloaded for the image and build leftovers (large, machine-local).
EXCLUDED: Final = (".wheelhouse", ".build", "__pycache__")
CACHE_ENV: Final = "SQUALL_CACHE_DIR"
MATRIX_SUFFIXES: Final = (".yaml", ".yml")
#: What the containers need of Squall's code: the package (its worker side never imports the host side).
WORKER_PACKAGES: Final = ("squall",)


class AssetError(RuntimeError):
    """An asset Squall ships is missing: the installation is broken or incomplete (exit code 3)."""


def package_dir() -> Path:
    """The directory of the installed ``squall`` package (a real directory: Docker mounts from it)."""
    files = importlib.resources.files("squall")
    if not isinstance(files, Path):
        raise AssetError(f"Squall's package is not on the file system ({files!r}): install it unzipped "
                         "(pip install squall), not as a zip archive")
    return files


def checkout_root() -> Path | None:
    """The repository root when Squall runs from a checkout (the folder holding squall/ and netem_profiles/)."""
    root = package_dir().parent
    return root if (root / "squall").is_dir() and (root / ASSET_DIRS[0]).is_dir() else None


def packaged_root() -> Path | None:
    """The wheel's asset folder (``squall/_assets``), or None when this is not an installed wheel."""
    root = package_dir() / PACKAGED_DIR
    return root if root.is_dir() else None


def layout() -> str:
    """``"wheel"`` (package data), ``"checkout"`` (the repository's folders) or ``"missing"``."""
    if packaged_root() is not None:
        return "wheel"
    return "checkout" if checkout_root() is not None else "missing"


def search_roots() -> list[Path]:
    """Where assets are looked up, in order: the wheel's package data, then the checkout."""
    roots = [root for root in (packaged_root(), checkout_root()) if root is not None]
    return roots or [package_dir() / PACKAGED_DIR]


def asset_path(relative: str) -> Path:
    """Where an asset is (``"containers/worker.Dockerfile"``); the first root's path when none has it.

    Never raises, so modules may keep the answer as a constant; :func:`require` checks it exists.
    """
    roots = search_roots()
    for root in roots:
        if (root / relative).exists():
            return root / relative
    return roots[0] / relative


def require(relative: str) -> Path:
    """The asset's path; :class:`AssetError` naming every place looked in when it is missing."""
    path = asset_path(relative)
    if path.exists():
        return path
    return missing(relative)


def missing(relative: str) -> Path:
    """Raise the :class:`AssetError` of an asset that is not where Squall looks for it."""
    looked = ", ".join(str(root / relative) for root in search_roots())
    raise AssetError(
        f"Squall's asset '{relative}' is missing (looked in {looked}): the installation is incomplete; "
        "reinstall it (pip install --force-reinstall squall) or run from a checkout of the repository"
    )


def profiles_dir() -> Path:
    """The shipped network profiles (``netem_profiles/``)."""
    return asset_path("netem_profiles")


def containers_dir() -> Path:
    """The worker image recipe (``containers/``: Dockerfile, requirements, debootstrap script)."""
    return asset_path("containers")


def matrices_dir() -> Path:
    """The shipped matrix files (``matrices/``)."""
    return asset_path("matrices")


def claims_file() -> Path:
    """The claims registry (``claims.yaml``)."""
    return asset_path("claims.yaml")


def matrix_names() -> list[str]:
    """The shipped matrices by name (``ci``, ``demo``, ...), sorted."""
    directory = matrices_dir()
    if not directory.is_dir():
        return []
    return sorted({p.stem for p in directory.iterdir() if p.suffix in MATRIX_SUFFIXES and p.is_file()})


def find_matrix(name_or_path: str | os.PathLike[str]) -> Path:
    """A matrix file by path (anything with a separator or a YAML suffix) or by shipped name (``ci``).

    :raises FileNotFoundError: no such file, or no shipped matrix of that name (the message lists them).
    """
    text = os.fspath(name_or_path)
    if isinstance(name_or_path, os.PathLike) or "/" in text or os.sep in text or text.endswith(MATRIX_SUFFIXES):
        path = Path(text)
        if not path.is_file():
            raise FileNotFoundError(f"matrix file {text}: no such file")
        return path
    for suffix in MATRIX_SUFFIXES:
        candidate = matrices_dir() / f"{text}{suffix}"
        if candidate.is_file():
            return candidate
    known = ", ".join(matrix_names()) or "none"
    raise FileNotFoundError(f"no matrix named {text!r} in {matrices_dir()} (shipped: {known}); "
                            "give a path to use your own file")


def cache_dir() -> Path:
    """A writable per-user folder for what Squall downloads or stages (``SQUALL_CACHE_DIR`` overrides)."""
    explicit = os.environ.get(CACHE_ENV)
    if explicit:
        return Path(explicit)
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "squall"


def wheelhouse() -> Path:
    """Where the worker image's wheels are downloaded: the checkout's ``containers/.wheelhouse``
    (kept from earlier builds), else the cache (package data may be read-only)."""
    checkout = checkout_root()
    if checkout is not None and packaged_root() is None:
        return checkout / "containers" / ".wheelhouse"
    return cache_dir() / "wheelhouse"


def _tree_digest(root: Path) -> str:
    """A hash of a package tree's file names, sizes and modification times (no file is read)."""
    h = hashlib.sha256()
    for path in sorted(root.rglob("*")):
        if "__pycache__" in path.parts or PACKAGED_DIR in path.parts or not path.is_file():
            continue
        stat = path.stat()
        h.update(f"{path.relative_to(root)}\0{stat.st_size}\0{stat.st_mtime_ns}\n".encode())
    return h.hexdigest()[:16]


def code_root() -> Path:
    """The host folder mounted at ``/squall/src`` in the containers: it holds the ``squall`` package.

    A checkout mounts its root. An installed wheel stages a copy of the installed ``squall``
    package (without ``_assets``) under :func:`cache_dir` (once per installed content), so nothing else of
    ``site-packages`` reaches the containers' ``PYTHONPATH``.
    """
    installed = package_dir().parent
    if packaged_root() is None:
        return installed
    sources = [installed / name for name in WORKER_PACKAGES]
    digest = hashlib.sha256("".join(_tree_digest(s) for s in sources).encode()).hexdigest()[:16]
    staged = cache_dir() / "code" / digest
    if staged.is_dir():
        return staged
    staged.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".staging-", dir=staged.parent))
    try:
        for source in sources:
            shutil.copytree(source, tmp / source.name,
                            ignore=shutil.ignore_patterns("__pycache__", "*.pyc", PACKAGED_DIR))
        tmp.chmod(0o755)
        try:
            tmp.rename(staged)
        except OSError:  # another process staged the same content first
            if not staged.is_dir():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    logger.info("staged Squall's worker code for the containers in %s", staged)
    return staged
