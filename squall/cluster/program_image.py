"""A worker image with a user's program's pip requirements, built from PyPI on the host, tagged by what it installs.

``squall image build --requirements FILE`` (or ``--pip PKG ...``) and ``squall run --requirements FILE``
call :func:`ensure_program_image`. Like the worker image, nothing is pulled from a container
registry and nothing is fetched inside the build:

1. on the host, ``pip download`` fetches wheels for the image's Python (CPython 3.11, manylinux,
   x86-64). The image's own packages (torch, numpy... as ``pip list`` says inside the image,
   :func:`installed_in`) are pinned, and offered to the resolver as empty placeholder wheels
   (:func:`placeholder_wheels`), so a requirement that needs torch is satisfied by the image's torch:
   nothing the image has is downloaded again, and never a second torch;
2. a requirement PyPI has only as a source distribution is made into a wheel on the host with
   ``pip wheel --no-deps``: a first resolution for this host (where source distributions are allowed)
   finds them, so that the resolution for the image never meets a package without a wheel (pip
   would backtrack through every version of everything before it says so); should one still be
   missing, :func:`missing_requirement` reads which and it is built too;
3. the build (``containers/program/Dockerfile``) installs them ``--no-index`` on top of the worker image.
   Wheels of CUDA or NVIDIA's runtime (:func:`squall.cluster.image.cuda_wheels`) stop it first.

The tag is ``squall-program:<hash>`` of the worker image's tag, the recipe and the sorted requirement
lines, so the same requirements reuse the image and a change builds a new one. The build context
(recipe and wheels) is kept in the cache under that hash (:func:`ensure_program_context`), so the same
image can be built again on an engine that has the worker image but not this one: a swarm node
(:mod:`squall.cluster.swarm.cluster`), which pulls nothing. A requirement that
cannot be had (no such package or version, no wheel and no buildable source) raises
:class:`RequirementsError` naming it, before any container starts.
"""

from __future__ import annotations

import base64
import hashlib
import logging
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from squall import assets
from squall.cluster.errors import ImageError
from squall.cluster.image import (
    CONTAINERS_DIR,
    WHEEL_PLATFORMS,
    cuda_wheels,
    current_worker_tag,
    ensure_variant_image,
)

logger = logging.getLogger(__name__)

REPO = "squall-program"
CONTEXTS = "program-context"  # <cache>/program-context/<tag's hash>: a program image's build context, kept
RECIPE_DIR = CONTAINERS_DIR / "program"
#: Wheels built on the host from source distributions carry the host's tag (the same CPython 3.11).
PLATFORMS = (*WHEEL_PLATFORMS, "manylinux_2_34_x86_64", "linux_x86_64")
MAX_BUILT = 20  # source distributions made into wheels for one image, at most
_MISSING = re.compile(r"Could not find a version that satisfies the requirement (\S+)")
_FREEZE = re.compile(r"^(?P<name>[A-Za-z0-9][A-Za-z0-9._-]*)==(?P<version>\S+)$")
#: Packages a build from source needs for real: never placeholders (what the image has is still kept out).
BUILD_TOOLS = frozenset({"pip", "setuptools", "wheel"})
#: A placeholder wheel's build number and tag: the most specific tag the image takes, and a build number,
#: so that pip prefers it to the same version's real wheel on an index (and downloads nothing the image has).
PLACEHOLDER_BUILD = "999"
PLACEHOLDER_TAG = f"cp311-cp311-{WHEEL_PLATFORMS[0]}"


class RequirementsError(ValueError):
    """A requirement that cannot be installed in the worker image; names it and says why."""


def normalized(requirements: Sequence[str]) -> str:
    """The requirements as the image's ``requirements.txt``: one per line, sorted, no duplicates."""
    return "".join(f"{line}\n" for line in sorted(set(requirements)))


def installed_in(client: Any, image: str) -> list[tuple[str, str]]:
    """``(name, version)`` of every package in the image's virtualenv (``pip list`` run in a throwaway container)."""
    try:
        out = client.containers.run(image, ["/opt/venv/bin/python", "-m", "pip", "list", "--format=freeze",
                                            "--disable-pip-version-check"], remove=True, network_mode="none")
    except Exception as exc:  # the engine's errors: the image cannot say what it holds
        raise ImageError(f"cannot list the packages of {image}: {exc}") from exc
    found = []
    for line in out.decode(errors="replace").splitlines():
        m = _FREEZE.match(line.strip())
        if m:
            found.append((m.group("name"), m.group("version")))
    if not found:
        raise ImageError(f"{image} lists no packages in /opt/venv")
    return found


def _dist(name: str) -> str:
    """A distribution's name as wheel file names write it."""
    return re.sub(r"[-_.]+", "_", name).lower()


def placeholder_wheels(packages: Sequence[tuple[str, str]], dest: Path, tag: str = "") -> set[str]:
    """An empty wheel per package (name, version, no files, no dependencies): the resolver takes them for
    what the image holds. Returns their file names (left out of the image's context).

    :param tag: the wheels' tag; default :data:`PLACEHOLDER_TAG` (the image's most specific one).
    """
    tag = tag or PLACEHOLDER_TAG
    dest.mkdir(parents=True, exist_ok=True)
    names = set()
    for name, version in packages:
        if _dist(name) in BUILD_TOOLS:
            continue  # building a source distribution installs these: they must be real
        stem = f"{_dist(name)}-{version}"
        path = dest / f"{stem}-{PLACEHOLDER_BUILD}-{tag}.whl"
        info = f"{stem}.dist-info"
        files = {f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n",
                 f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: squall\nRoot-Is-Purelib: false\n"
                                  f"Build: {PLACEHOLDER_BUILD}\nTag: {tag}\n"}
        record = [f"{k},sha256={base64.urlsafe_b64encode(hashlib.sha256(v.encode()).digest()).rstrip(b'=').decode()},"
                  f"{len(v.encode())}" for k, v in files.items()]
        files[f"{info}/RECORD"] = "\n".join([*record, f"{info}/RECORD,,"]) + "\n"
        with zipfile.ZipFile(path, "w") as zf:
            for k, v in files.items():
                zf.writestr(k, v)
        names.add(path.name)
    return names


def missing_requirement(pip_stderr: str) -> str | None:
    """The requirement pip found no wheel for, from its error output (None when that is not the failure)."""
    m = _MISSING.search(pip_stderr)
    return m.group(1) if m else None


def _tail(text: str, lines: int = 8) -> str:
    return "\n    ".join(line for line in text.strip().splitlines()[-lines:])


def _pip(*args: str) -> subprocess.CompletedProcess[str]:
    cmd = [sys.executable, "-m", "pip", "--disable-pip-version-check", *args]
    logger.debug("%s", " ".join(cmd))
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def download(requirements: Path, dest: Path, *, work: Path, source: str,
             installed: Sequence[tuple[str, str]]) -> list[Path]:
    """Wheels for ``requirements`` and everything they need that the image (``installed``) lacks, into ``dest``.

    :raises RequirementsError: a requirement has no wheel for the image and cannot be built into one.
    """
    constraints = work / "image-constraints.txt"
    constraints.write_text("".join(f"{name}=={version}\n" for name, version in installed))
    placeholders = work / "image"
    have = placeholder_wheels(installed, placeholders)
    built = work / "built"
    built.mkdir(exist_ok=True)
    build_source_only(requirements, work=work, constraints=constraints, installed=installed, built=built,
                      source=source)
    everything = work / "all"
    tried: set[str] = set()
    platforms = [arg for p in PLATFORMS for arg in ("--platform", p)]
    while True:
        proc = _pip("download", "-q", "-r", str(requirements), "-c", str(constraints), "-d", str(everything),
                    "--find-links", str(placeholders), "--find-links", str(built), "--only-binary=:all:",
                    "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311", *platforms)
        if proc.returncode == 0:
            break
        missing = missing_requirement(proc.stderr)
        if missing is None or missing in tried or len(tried) >= MAX_BUILT:
            raise RequirementsError(f"{source}: pip cannot get the requirements for the worker image (CPython 3.11, "
                                    f"manylinux x86-64, with the image's torch):\n    {_tail(proc.stderr)}")
        tried.add(missing)
        logger.info("no wheel of %s for the image: building one from its source distribution", missing)
        made = _pip("wheel", "-q", "--no-deps", "-w", str(built), missing)
        if made.returncode != 0:
            raise RequirementsError(f"{source}: {missing!r} cannot be installed: PyPI has no wheel of it for the "
                                    f"worker image, and no source it could be built from:\n    {_tail(made.stderr)}")
    dest.mkdir(parents=True, exist_ok=True)
    image = {_dist(name) for name, _ in installed}
    kept = []
    for wheel in sorted(everything.glob("*.whl")):
        if wheel.name not in have and _dist(wheel.name.split("-", 1)[0]) not in image:  # the image has it already
            shutil.copy(wheel, dest / wheel.name)
            kept.append(dest / wheel.name)
    cuda = cuda_wheels(w.name for w in kept)
    if cuda:
        raise RequirementsError(f"{source}: the requirements would put CUDA in the worker image ({', '.join(cuda)}); "
                                "the workers run on CPUs and the image's torch is its CPU build: drop the "
                                "GPU packages, or require torch itself (the image's satisfies it)")
    return kept


def build_source_only(requirements: Path, *, work: Path, constraints: Path, installed: Sequence[tuple[str, str]],
                      built: Path, source: str) -> None:
    """Wheels, in ``built``, of the requirements PyPI has only as source distributions (see the module docstring)."""
    anywhere = work / "image-any"
    placeholder_wheels(installed, anywhere, tag="py3-none-any")
    native = work / "native"
    proc = _pip("download", "-q", "-r", str(requirements), "-c", str(constraints), "-d", str(native),
                "--find-links", str(anywhere))
    if proc.returncode != 0:
        missing = missing_requirement(proc.stderr)
        what = f"{missing!r} cannot be installed" if missing else "pip cannot resolve the requirements"
        raise RequirementsError(f"{source}: {what}:\n    {_tail(proc.stderr)}")
    sources = sorted(p for p in native.iterdir() if p.name.endswith((".tar.gz", ".zip", ".tar.bz2")))
    for sdist in sources:
        logger.info("%s has no wheel on PyPI: building one from its source distribution", sdist.name)
        made = _pip("wheel", "-q", "--no-deps", "-w", str(built), str(sdist))
        if made.returncode != 0:
            raise RequirementsError(f"{source}: {sdist.name} has no wheel and does not build into one:\n    "
                                    f"{_tail(made.stderr)}")


def program_image_tag(client: Any, requirements: Sequence[str]) -> str | None:
    """The tag the image for ``requirements`` has (None: the worker image itself is not built)."""
    from squall.cluster.image import variant_tag

    base = current_worker_tag(client)
    if base is None:
        return None
    with tempfile.TemporaryDirectory(prefix="squall-program-recipe-") as tmp:
        recipe = _recipe(Path(tmp), requirements)
        return variant_tag(REPO, base, recipe, ("Dockerfile", "requirements.txt"))


def _recipe(where: Path, requirements: Sequence[str]) -> Path:
    shutil.copy(RECIPE_DIR / "Dockerfile", where / "Dockerfile")
    (where / "requirements.txt").write_text(normalized(requirements))
    return where


def context_dir(tag: str) -> Path:
    """Where the build context of program image ``tag`` is kept (it may not be there)."""
    repo, _, digest = tag.partition(":")
    if repo != REPO or not re.fullmatch(r"[0-9a-f]{6,64}", digest):
        raise ImageError(f"{tag!r} is not a program image's tag ({REPO}:<hash>)")
    return assets.cache_dir() / CONTEXTS / digest


def cached_context(tag: str) -> Path | None:
    """The kept build context of program image ``tag``, or None (not a program image, or never kept)."""
    try:
        folder = context_dir(tag)
    except ImageError:
        return None
    return folder if (folder / "Dockerfile").is_file() else None


def _keep_context(context: Path, tag: str) -> Path:
    dest = context_dir(tag)
    if (dest / "Dockerfile").is_file():
        return dest
    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=".keeping-", dir=dest.parent))
    try:
        shutil.copytree(context, tmp / "context")
        try:
            (tmp / "context").rename(dest)
        except OSError:  # another process kept the same context first
            if not (dest / "Dockerfile").is_file():
                raise
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return dest


def ensure_program_context(client: Any, requirements: Sequence[str], *, source: str) -> Path:
    """The build context (recipe, ``requirements.txt``, wheels) of the image for ``requirements``, downloaded
    and kept if it is not yet: what a node that lacks the image builds it from.

    :raises RequirementsError: a requirement cannot be installed.
    :raises ImageError: the worker image is not built.
    """
    tag = program_image_tag(client, requirements)
    if tag is None:
        raise ImageError("the worker image is not built: run 'squall image build' (or 'make image') first")
    kept = cached_context(tag)
    if kept is not None:
        return kept
    base = current_worker_tag(client)
    assert base is not None
    with tempfile.TemporaryDirectory(prefix="squall-program-") as tmp:
        work = Path(tmp)
        (work / "recipe").mkdir()
        recipe = _recipe(work / "recipe", requirements)
        wheels = download(recipe / "requirements.txt", recipe / "wheels", work=work, source=source,
                          installed=installed_in(client, base))
        logger.info("%d wheels kept for building %s on other engines (%s)", len(wheels), tag, source)
        return _keep_context(recipe, tag)


def ensure_program_image(client: Any, requirements: Sequence[str], *, source: str) -> str:
    """The worker image with ``requirements`` installed, built if it is missing; its tag.

    :raises RequirementsError: a requirement cannot be installed (before anything is built).
    :raises ImageError: the worker image is not built, or the build failed.
    """
    if not requirements:
        raise RequirementsError(f"{source}: no requirements to install")
    if not (RECIPE_DIR / "Dockerfile").is_file():
        raise ImageError(f"the program image recipe {RECIPE_DIR / 'Dockerfile'} is missing")
    with tempfile.TemporaryDirectory(prefix="squall-program-") as tmp:
        work = Path(tmp)
        (work / "recipe").mkdir()
        recipe = _recipe(work / "recipe", requirements)

        def prepare(context: Path) -> None:
            base = current_worker_tag(client)
            assert base is not None  # ensure_variant_image checked it before calling this
            wheels = download(context / "requirements.txt", context / "wheels", work=work, source=source,
                              installed=installed_in(client, base))
            logger.info("%d wheels for the program image (%s)", len(wheels), source)
            tag = program_image_tag(client, requirements)
            if tag is not None:  # kept for the engines that lack the image (swarm nodes)
                _keep_context(context, tag)

        return ensure_variant_image(client, repo=REPO, recipe_dir=recipe, files=("Dockerfile", "requirements.txt"),
                                    prepare=prepare)
