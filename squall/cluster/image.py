"""The worker image: built from the host's own downloads, tagged by a hash of its inputs.

Two layers:

* **base**: an image with Python 3.11, chosen in this order: ``SQUALL_BASE_IMAGE`` (a local image the
  user names); ``python:3.11-slim`` when the engine has it; a base this machine debootstrapped
  earlier; ``python:3.11-slim`` pulled when the registry answers (``squall image build --pull``
  insists on it, ``--no-pull`` never asks); otherwise a Debian bookworm root made with
  ``debootstrap`` from a Debian mirror (:data:`DEFAULT_DEBIAN_MIRROR`, or ``SQUALL_DEBIAN_MIRROR``),
  never from the host's apt sources, so the host may be Ubuntu, Debian 13 or anything with
  debootstrap, and ``docker import``-ed as ``squall-base:<hash>``.
* **worker**: the base plus a virtualenv at ``/opt/venv`` with ``containers/requirements.txt``
  installed from wheels downloaded on the host beforehand (:func:`download_wheels`). torch is its CPU
  build (``torch==X+cpu``), found through pip's own configuration plus a CPU index
  (:data:`DEFAULT_TORCH_INDEX` where it answers, or ``SQUALL_TORCH_INDEX``); a resolution that would
  put CUDA or nvidia wheels in the image stops the build with their names (:func:`cuda_wheels`).

The tag of each layer is a hash of what went into it, so building twice rebuilds nothing; the
project's code is mounted at run time and is not an input.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
import shutil
import subprocess
import sys
import tempfile
import urllib.error
import urllib.request
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import urlparse

from docker.errors import DockerException, ImageNotFound

from squall import assets
from squall.cluster.errors import ImageError

logger = logging.getLogger(__name__)

#: The host folder mounted read-only at /squall/src: the checkout, or a staged copy of the installed
#: ``protocols`` package (squall/assets.py says why).
REPO_ROOT = assets.code_root()
#: The recipe: package data of an installed Squall, the checkout's ``containers/`` otherwise.
CONTAINERS_DIR = assets.containers_dir()
DOCKERFILE = CONTAINERS_DIR / "worker.Dockerfile"
REQUIREMENTS = CONTAINERS_DIR / "requirements.txt"
DEBOOTSTRAP_SCRIPT = CONTAINERS_DIR / "base" / "debootstrap.sh"
#: Wheels downloaded on the host for the image: a writable folder (never inside package data).
WHEELHOUSE = assets.wheelhouse()

SLIM_BASE = "python:3.11-slim"
BASE_IMAGE_ENV = "SQUALL_BASE_IMAGE"  # a local image to build on instead (Python 3.11 with venv)
BOOTSTRAP_SUITE = "bookworm"  # its python3 is 3.11, matching the cp311 torch wheel
BOOTSTRAP_PACKAGES = ("python3", "python3-venv", "iproute2", "procps")
#: The Debian mirror debootstrap reads when ``SQUALL_DEBIAN_MIRROR`` names none: Debian's own
#: redirector to a mirror near the machine (https://deb.debian.org).
DEFAULT_DEBIAN_MIRROR = "http://deb.debian.org/debian"
MIRROR_ENV = "SQUALL_DEBIAN_MIRROR"
#: Where torch's CPU build is published, asked in addition to pip's own configuration when it answers.
DEFAULT_TORCH_INDEX = "https://download.pytorch.org/whl/cpu"
#: An index URL, or "none" for pip's own configuration only (an index mirror, a find-links folder).
TORCH_INDEX_ENV = "SQUALL_TORCH_INDEX"
AUTO_INDEX = "auto"  # download_wheels: the index torch_index() chooses
PROBE_TIMEOUT_S = 10.0  # asking whether a registry, an index or a mirror answers
WORKER_REPO = "squall-worker"
BASE_REPO = "squall-base"
#: pip platform tags for the wheels of the image (Debian 12 has glibc 2.36).
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")
#: Distributions that mean CUDA in the image: NVIDIA's runtime wheels and torch's GPU compiler.
CUDA_DISTRIBUTIONS = re.compile(r"^(nvidia[-_]|triton-|cuda[-_]|cupy[-_]|torch-[^-]*\+cu\d)", re.IGNORECASE)
#: The lines of pip's download output that name a file it resolved (saved now, or found in the folder).
_RESOLVED = re.compile(r"^\s*(?:Saved|File was already downloaded) (?P<path>\S+\.whl)\s*$", re.MULTILINE)


@dataclass(frozen=True)
class BaseChoice:
    """Which base image the worker image is built on."""

    tag: str  # image reference, e.g. "python:3.11-slim" or "squall-base:1a2b3c4d5e6f"
    source: str  # "local" (already present), "debootstrap" (to be built here) or "pull"
    identity: str  # what the worker hash depends on: an image id, or the bootstrap recipe hash


def digest(parts: Iterable[str | bytes]) -> str:
    """A short hash of ``parts`` in order: the tag of an image built from them."""
    h = hashlib.sha256()
    for part in parts:
        h.update(part.encode() if isinstance(part, str) else part)
        h.update(b"\0")
    return h.hexdigest()[:12]


def _read_recipe(path: Path) -> bytes:
    """A recipe file's bytes; a missing one is an ImageError (exit code 3) naming where Squall looked."""
    try:
        return path.read_bytes()
    except FileNotFoundError:
        try:
            relative = f"containers/{path.relative_to(CONTAINERS_DIR).as_posix()}"
        except ValueError:  # a recipe file given from elsewhere (tests)
            raise ImageError(f"the worker image recipe file {path} is missing") from None
        try:
            assets.missing(relative)
        except assets.AssetError as exc:
            raise ImageError(str(exc)) from None
        raise  # pragma: no cover - missing() always raises


def bootstrap_tag() -> str:
    """Tag of the debootstrap base: a hash of the script, the suite and the package list."""
    return f"{BASE_REPO}:" + digest(
        [_read_recipe(DEBOOTSTRAP_SCRIPT), BOOTSTRAP_SUITE, " ".join(BOOTSTRAP_PACKAGES)]
    )


def worker_tag(base_identity: str) -> str:
    """Tag of the worker image: a hash of the Dockerfile, the requirements and the base."""
    return f"{WORKER_REPO}:" + digest([_read_recipe(DOCKERFILE), _read_recipe(REQUIREMENTS), base_identity])


def debian_mirror(env: Mapping[str, str] | None = None) -> str:
    """The Debian mirror the debootstrap base is made from: ``SQUALL_DEBIAN_MIRROR``, else the default.

    The host's own apt sources are never read: on Ubuntu or Debian 13 they have no bookworm.

    :raises ImageError: the setting is not an ``http://``, ``https://`` or ``file://`` URL.
    """
    value = ((env if env is not None else os.environ).get(MIRROR_ENV) or "").strip() or DEFAULT_DEBIAN_MIRROR
    parsed = urlparse(value)
    if parsed.scheme not in ("http", "https", "file") or not (parsed.netloc or parsed.path.strip("/")):
        raise ImageError(f"{MIRROR_ENV}={value!r} is not a Debian mirror URL: give http://, https:// or file:// "
                         f"and the archive's root, e.g. {DEFAULT_DEBIAN_MIRROR}")
    return value.rstrip("/")


def check_mirror(mirror: str, suite: str = BOOTSTRAP_SUITE, *, timeout: float = 30.0) -> None:
    """Ask ``mirror`` for ``suite``'s Release file before debootstrap spends a minute finding out.

    :raises ImageError: it does not answer, or has no such suite; says what to set instead.
    """
    url = f"{mirror}/dists/{suite}/Release"
    try:
        with urllib.request.urlopen(url, timeout=timeout) as answer:
            head = answer.read(4096).decode(errors="replace")
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise ImageError(
            f"the Debian mirror {mirror} does not serve {suite} ({url}: {reason}): set {MIRROR_ENV} to a Debian "
            f"mirror this machine can reach, or give the image a base: 'docker pull {SLIM_BASE}' (or "
            f"'squall image build --pull' where a registry answers), or {BASE_IMAGE_ENV}=<a local image with "
            "Python 3.11>") from None
    if f"Codename: {suite}" not in head and f"Suite: {suite}" not in head:
        raise ImageError(f"{url} is not the Release file of Debian {suite}: is {mirror} a Debian mirror? "
                         f"Set {MIRROR_ENV} to one")


def torch_index(env: Mapping[str, str] | None = None, *, probe: Callable[[str], str] | None = None) -> str | None:
    """The extra index the image's wheels are downloaded with (None: pip's own configuration only).

    ``SQUALL_TORCH_INDEX`` set to a URL is used as it is; set to ``none`` (or empty), none is added.
    Unset: :data:`DEFAULT_TORCH_INDEX` when it answers (``probe`` returns '' for an answer, else
    why not), else none, with a warning: pip's configuration must then offer the CPU build.
    """
    environ = env if env is not None else os.environ
    if TORCH_INDEX_ENV in environ:
        value = environ[TORCH_INDEX_ENV].strip()
        if value.lower() in ("", "none"):
            return None
        if urlparse(value).scheme not in ("http", "https", "file"):
            raise ImageError(f"{TORCH_INDEX_ENV}={value!r} is not an index URL: give http://, https:// or "
                             f"file://, e.g. {DEFAULT_TORCH_INDEX}, or 'none' for pip's own configuration")
        return value
    why = (probe or answers)(DEFAULT_TORCH_INDEX + "/torch/")
    if why:
        logger.warning("torch's CPU index %s does not answer (%s): pip's own configuration must offer the CPU "
                       "build (%s=URL names another index)", DEFAULT_TORCH_INDEX, why, TORCH_INDEX_ENV)
        return None
    return DEFAULT_TORCH_INDEX


def answers(url: str, *, timeout: float = PROBE_TIMEOUT_S) -> str:
    """'' when ``url`` answers an HTTP request (any status but a server error), else why not."""
    request = urllib.request.Request(url, method="HEAD")
    try:
        with urllib.request.urlopen(request, timeout=timeout):
            return ""
    except urllib.error.HTTPError as exc:
        return "" if exc.code < 500 else f"HTTP {exc.code}"
    except (urllib.error.URLError, OSError, ValueError) as exc:
        return str(getattr(exc, "reason", exc))


def cuda_wheels(names: Iterable[str]) -> list[str]:
    """The wheel file names among ``names`` that would put CUDA in the image (:data:`CUDA_DISTRIBUTIONS`)."""
    return sorted(name for name in names if CUDA_DISTRIBUTIONS.match(Path(name).name))


def resolved_wheels(pip_output: str) -> list[Path]:
    """The wheels a ``pip download`` run resolved, read from its output (saved now, or already there)."""
    return [Path(m.group("path")) for m in _RESOLVED.finditer(pip_output)]


def _image_id(client: Any, ref: str) -> str | None:
    try:
        return str(client.images.get(ref).id)
    except ImageNotFound:
        return None


def choose_base(client: Any, *, pull: bool | None = None) -> BaseChoice:
    """Pick the base image (the module docstring's order); nothing is pulled or built here.

    :param pull: True: ``python:3.11-slim`` from the registry unless the engine has it (no
        debootstrap); False: never a registry; None: a pull is the choice when no base is present
        (:func:`ensure_worker_image` falls back to debootstrap when the registry does not answer).
    """
    wanted = os.environ.get(BASE_IMAGE_ENV)
    if wanted:
        image_id = _image_id(client, wanted)
        if image_id is None:
            raise ImageError(f"{BASE_IMAGE_ENV}={wanted!r} is not present in the Docker engine")
        return BaseChoice(wanted, "local", image_id)
    image_id = _image_id(client, SLIM_BASE)
    if image_id is not None:
        return BaseChoice(SLIM_BASE, "local", image_id)
    tag = bootstrap_tag()
    if pull is not True and _image_id(client, tag) is not None:
        return BaseChoice(tag, "local", tag)
    if pull is not False:
        return BaseChoice(SLIM_BASE, "pull", "")
    return BaseChoice(tag, "debootstrap", tag)


def registry_problem(client: Any, ref: str = SLIM_BASE) -> str:
    """'' when the engine's registry answers for ``ref`` (its manifest, not its layers), else why not."""
    try:
        client.api.inspect_distribution(ref)
    except DockerException as exc:
        return str(exc)
    return ""


def _pull_base(client: Any, *, insist: bool) -> BaseChoice | None:
    """``python:3.11-slim`` pulled, as the base; None when the registry does not answer and ``insist`` is off."""
    problem = registry_problem(client)
    if not problem:
        logger.info("pulling %s", SLIM_BASE)
        try:
            client.images.pull(SLIM_BASE)
            return choose_base(client, pull=False)
        except DockerException as exc:
            problem = str(exc)
    if insist:
        raise ImageError(f"pulling {SLIM_BASE} failed ({problem}); without --pull, Squall makes a Debian base "
                         f"with debootstrap from {MIRROR_ENV} (default {DEFAULT_DEBIAN_MIRROR})")
    logger.info("no registry answers for %s (%s): making a Debian %s base with debootstrap", SLIM_BASE,
                problem.splitlines()[0][:200] if problem else "?", BOOTSTRAP_SUITE)
    return None


def build_debootstrap_base(tag: str) -> None:
    """Make the Debian base ``tag`` with debootstrap from :func:`debian_mirror` (asked first: :func:`check_mirror`).

    :raises ImageError: the mirror does not serve the suite, or debootstrap or the import failed.
    """
    mirror = debian_mirror()
    check_mirror(mirror)
    logger.info("building base image %s with debootstrap (%s from %s, about a minute)", tag, BOOTSTRAP_SUITE, mirror)
    proc = subprocess.run(
        ["bash", str(DEBOOTSTRAP_SCRIPT), tag, BOOTSTRAP_SUITE, mirror, ",".join(BOOTSTRAP_PACKAGES)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ImageError(f"debootstrap base image {tag} from {mirror} failed: {proc.stderr.strip()[-2000:]}")


def download_command(requirements: Path, dest: Path, index: str | None) -> list[str]:
    """The ``pip download`` of the image's wheels (cp311, manylinux), with ``index`` added when given."""
    cmd = [sys.executable, "-m", "pip", "download", "--disable-pip-version-check", "--progress-bar", "off",
           "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
           "--dest", str(dest), "-r", str(requirements)]
    if index is not None:
        cmd += ["--extra-index-url", index]
    for platform in WHEEL_PLATFORMS:
        cmd += ["--platform", platform]
    return cmd


def download_wheels(dest: Path = WHEELHOUSE, *, requirements: Path = REQUIREMENTS,
                    index: str | None = AUTO_INDEX) -> list[Path]:
    """Download the image's wheels on the host, so the build needs no network; the wheels resolved.

    :param index: the extra index URL; :data:`AUTO_INDEX`: :func:`torch_index`'s choice; None: pip's
        configuration only.
    :raises ImageError: pip cannot resolve them (torch's CPU build missing: where to get it), or they
        hold CUDA or nvidia wheels (named).
    """
    dest.mkdir(parents=True, exist_ok=True)
    extra = torch_index() if index == AUTO_INDEX else index
    proc = subprocess.run(download_command(requirements, dest, extra), capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        source = extra or "pip's own configuration (no extra index)"
        raise ImageError(f"downloading the worker image's wheels ({requirements}) from {source} failed: "
                         f"{proc.stderr.strip()[-2000:]}\ntorch's CPU build comes from {TORCH_INDEX_ENV} (default "
                         f"{DEFAULT_TORCH_INDEX} where it answers) or from an index or find-links folder in pip's "
                         "configuration")
    wheels = resolved_wheels(proc.stdout)
    if not wheels:
        raise ImageError(f"pip download resolved no wheel for {requirements}: its output was\n{proc.stdout[-2000:]}")
    cuda = cuda_wheels(w.name for w in wheels)
    if cuda:
        raise ImageError(f"the worker image would get CUDA: {', '.join(cuda)} (resolved for {requirements} from "
                         f"{extra or 'pip configuration'}). Squall's workers run on CPUs: pin torch's CPU build "
                         f"(torch==X+cpu) and give an index that has it ({TORCH_INDEX_ENV}, default "
                         f"{DEFAULT_TORCH_INDEX})")
    return wheels


def _build_worker(client: Any, tag: str, base: str) -> None:
    resolved = download_wheels()
    with tempfile.TemporaryDirectory(prefix="squall-image-") as tmp:
        ctx = Path(tmp)
        shutil.copy(DOCKERFILE, ctx / "Dockerfile")
        shutil.copy(REQUIREMENTS, ctx / "requirements.txt")
        wheels = ctx / "wheels"
        wheels.mkdir()
        for wheel in resolved:  # only what this resolution chose, not every file the wheelhouse kept
            try:
                os.link(wheel, wheels / wheel.name)
            except OSError:
                shutil.copy(wheel, wheels / wheel.name)
        logger.info("building worker image %s on %s", tag, base)
        try:
            client.images.build(path=str(ctx), tag=tag, buildargs={"BASE": base}, rm=True, forcerm=True,
                                labels={"squall.image": "worker"})
        except DockerException as exc:
            raise ImageError(f"building worker image {tag} failed: {exc}") from exc


def ensure_worker_image(client: Any, *, pull: bool | None = None) -> str:
    """Return the worker image tag, building the base and the worker only if they are missing.

    :param pull: as :func:`choose_base` (``squall image build --pull`` / ``--no-pull``).
    """
    base = choose_base(client, pull=pull)
    if base.source == "pull":
        pulled = _pull_base(client, insist=pull is True)
        base = pulled if pulled is not None else choose_base(client, pull=False)
    if base.source == "debootstrap":
        build_debootstrap_base(base.tag)
    tag = worker_tag(base.identity)
    if _image_id(client, tag) is None:
        _build_worker(client, tag, base.tag)
    else:
        logger.debug("worker image %s is up to date", tag)
    return tag


def current_worker_tag(client: Any) -> str | None:
    """The tag the worker image has for the current inputs, or None when it is not built yet."""
    base = choose_base(client, pull=False)
    if base.source != "local":
        return None
    tag = worker_tag(base.identity)
    return tag if _image_id(client, tag) else None


def variant_tag(repo: str, base_tag: str, recipe_dir: Path, files: Iterable[str]) -> str:
    """The tag of an image built on ``base_tag`` from ``recipe_dir``'s ``files``: a hash of all of them."""
    return f"{repo}:{digest([base_tag, *((recipe_dir / name).read_bytes() for name in files)])}"


def ensure_variant_image(
    client: Any,
    *,
    repo: str,
    recipe_dir: Path,
    files: Sequence[str] = ("Dockerfile", "requirements.txt"),
    prepare: Callable[[Path], None] | None = None,
) -> str:
    """An image on top of the current worker image (e.g. a reference implementation to measure against).

    Its Dockerfile takes the worker image as ``ARG BASE``; ``prepare(context)`` may add files (wheels
    downloaded on the host) to the build context before the build. Tagged by a hash of the worker tag
    and the recipe's ``files``, so it is built once per change of either.

    :raises ImageError: the worker image is not built, or the build fails.
    """
    base = current_worker_tag(client)
    if base is None:
        raise ImageError("the worker image is not built: run 'squall image build' (or 'make image') first")
    tag = variant_tag(repo, base, recipe_dir, files)
    if _image_id(client, tag) is not None:
        return tag
    with tempfile.TemporaryDirectory(prefix=f"squall-{repo.rsplit('/', 1)[-1]}-") as tmp:
        context = Path(tmp) / "context"
        context.mkdir()
        for name in files:
            shutil.copy(recipe_dir / name, context / name)
        if prepare is not None:
            prepare(context)
        logger.info("building %s on %s", tag, base)
        try:
            client.images.build(path=str(context), tag=tag, buildargs={"BASE": base}, rm=True, forcerm=True,
                                labels={"squall.image": repo})
        except DockerException as exc:
            raise ImageError(f"building {tag} failed: {exc}") from exc
    return tag
