"""The worker image: built from local material only, tagged by a hash of its inputs.

Two layers:

* **base**: ``python:3.11-slim`` when it is already present in the engine (or ``SQUALL_BASE_IMAGE``
  names another local image with Python 3.11 and venv); otherwise a Debian bookworm root filesystem
  made with ``debootstrap`` from this machine's own apt configuration and ``docker import``-ed.
  Pulling from a registry is never attempted implicitly: ``squall image build --pull`` asks for it.
* **worker**: the base plus a virtualenv at ``/opt/venv`` with ``containers/requirements.txt``
  installed from wheels downloaded on the host beforehand (torch from the on-disk CPU wheel).

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
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

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
BOOTSTRAP_SUITE = "bookworm"  # its python3 is 3.11, matching the cp311 torch wheel
BOOTSTRAP_PACKAGES = ("python3", "python3-venv", "iproute2", "procps")
WORKER_REPO = "squall-worker"
BASE_REPO = "squall-base"
#: pip platform tags for the wheels of the image (Debian 12 has glibc 2.36).
WHEEL_PLATFORMS = ("manylinux_2_28_x86_64", "manylinux_2_17_x86_64", "manylinux2014_x86_64")


@dataclass(frozen=True)
class BaseChoice:
    """Which base image the worker image is built on."""

    tag: str  # image reference, e.g. "python:3.11-slim" or "squall-base:1a2b3c4d5e6f"
    source: str  # "local" (already present), "debootstrap" (to be built here) or "pull"
    identity: str  # what the worker hash depends on: an image id, or the bootstrap recipe hash


@dataclass(frozen=True)
class AptSource:
    """One ``deb`` entry of the machine's apt configuration."""

    uri: str  # e.g. "http://mirror.example/debian"
    suites: tuple[str, ...]  # e.g. ("bookworm", "bookworm-updates")


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


def parse_apt_sources(texts: Iterable[tuple[str, str]]) -> list[AptSource]:
    """Parse apt source files given as ``(file name, text)``: one-line ``.list`` and deb822 ``.sources``."""
    out: list[AptSource] = []
    for name, text in texts:
        if name.endswith(".sources"):
            for stanza in re.split(r"\n\s*\n", text):
                fields: dict[str, str] = {}
                for line in stanza.splitlines():
                    if line.startswith("#") or ":" not in line:
                        continue
                    key, _, value = line.partition(":")
                    fields[key.strip().lower()] = value.strip()
                if "deb" not in fields.get("types", "").split() or fields.get("enabled", "yes") == "no":
                    continue
                suites = tuple(fields.get("suites", "").split())
                out.extend(AptSource(uri, suites) for uri in fields.get("uris", "").split())
        else:
            for line in text.splitlines():
                words = re.sub(r"\[[^\]]*\]", "", line.split("#", 1)[0]).split()
                if len(words) >= 3 and words[0] == "deb":
                    out.append(AptSource(words[1], (words[2],)))
    return out


def apt_mirror(suite: str = BOOTSTRAP_SUITE, etc: Path = Path("/etc/apt")) -> str:
    """The mirror this machine's apt uses for ``suite`` (never hard-coded in the repository)."""
    files = [etc / "sources.list", *sorted((etc / "sources.list.d").glob("*"))]
    texts = [(f.name, f.read_text()) for f in files if f.is_file() and f.suffix in {".list", ".sources"}]
    for source in parse_apt_sources(texts):
        if suite in source.suites:
            return source.uri
    raise ImageError(
        f"no apt source for Debian '{suite}' in {etc}: the offline base image needs a Debian {suite} "
        f"mirror in the apt configuration, or a local '{SLIM_BASE}' image (docker pull {SLIM_BASE})"
    )


def _image_id(client: Any, ref: str) -> str | None:
    try:
        return str(client.images.get(ref).id)
    except ImageNotFound:
        return None


def choose_base(client: Any, *, pull: bool = False) -> BaseChoice:
    """Pick the base image: an explicit ``SQUALL_BASE_IMAGE``, local slim, a pull if asked, or debootstrap."""
    wanted = os.environ.get("SQUALL_BASE_IMAGE")
    if wanted:
        image_id = _image_id(client, wanted)
        if image_id is None:
            raise ImageError(f"SQUALL_BASE_IMAGE={wanted!r} is not present in the Docker engine")
        return BaseChoice(wanted, "local", image_id)
    image_id = _image_id(client, SLIM_BASE)
    if image_id is not None:
        return BaseChoice(SLIM_BASE, "local", image_id)
    if pull:
        return BaseChoice(SLIM_BASE, "pull", "")
    tag = bootstrap_tag()
    return BaseChoice(tag, "local" if _image_id(client, tag) else "debootstrap", tag)


def _build_debootstrap_base(tag: str) -> None:
    mirror = apt_mirror()
    logger.info("building base image %s with debootstrap (%s, about a minute)", tag, BOOTSTRAP_SUITE)
    proc = subprocess.run(
        ["bash", str(DEBOOTSTRAP_SCRIPT), tag, BOOTSTRAP_SUITE, mirror, ",".join(BOOTSTRAP_PACKAGES)],
        capture_output=True,
        text=True,
        check=False,
    )
    if proc.returncode != 0:
        raise ImageError(f"debootstrap base image {tag} failed: {proc.stderr.strip()[-2000:]}")


def download_wheels(dest: Path = WHEELHOUSE) -> None:
    """Download the image's wheels on the host (cp311, manylinux), so the build needs no network."""
    dest.mkdir(parents=True, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "download", "--quiet", "--disable-pip-version-check",
           "--only-binary=:all:", "--python-version", "3.11", "--implementation", "cp", "--abi", "cp311",
           "--dest", str(dest), "-r", str(REQUIREMENTS)]
    for platform in WHEEL_PLATFORMS:
        cmd += ["--platform", platform]
    proc = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageError(f"downloading the worker image's wheels failed: {proc.stderr.strip()[-2000:]}")


def _build_worker(client: Any, tag: str, base: str) -> None:
    download_wheels()
    with tempfile.TemporaryDirectory(prefix="squall-image-") as tmp:
        ctx = Path(tmp)
        shutil.copy(DOCKERFILE, ctx / "Dockerfile")
        shutil.copy(REQUIREMENTS, ctx / "requirements.txt")
        wheels = ctx / "wheels"
        wheels.mkdir()
        for wheel in WHEELHOUSE.glob("*.whl"):
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


def ensure_worker_image(client: Any, *, pull: bool = False) -> str:
    """Return the worker image tag, building the base and the worker only if they are missing."""
    base = choose_base(client, pull=pull)
    if base.source == "pull":
        logger.info("pulling %s", base.tag)
        try:
            client.images.pull(base.tag)
        except DockerException as exc:
            raise ImageError(f"pulling {base.tag} failed: {exc}") from exc
        base = choose_base(client)
    elif base.source == "debootstrap":
        _build_debootstrap_base(base.tag)
    tag = worker_tag(base.identity)
    if _image_id(client, tag) is None:
        _build_worker(client, tag, base.tag)
    else:
        logger.debug("worker image %s is up to date", tag)
    return tag


def current_worker_tag(client: Any) -> str | None:
    """The tag the worker image has for the current inputs, or None when it is not built yet."""
    base = choose_base(client)
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
