"""The Docker-in-Docker node image of the two-node swarm test, built from local material only.

Two layers, each tagged by a hash of what went into it, so a second run rebuilds nothing:

* ``squall-dind-root:<hash>``: a Debian 12 root made with ``debootstrap`` from the Debian mirror
  the worker image's base uses (:func:`squall.cluster.image.debian_mirror`: ``SQUALL_DEBIAN_MIRROR``
  or Debian's own), with Debian's ``docker.io`` and ``iptables``, ``docker import``-ed;
* ``squall-dind-node:<hash>``: that root plus ``containers/dind-node/`` (the entrypoint that
  starts the node's own engine, ``/var/lib/docker`` as a volume).

Nothing is pulled from a registry.
"""

from __future__ import annotations

import logging
import subprocess
import tempfile
from pathlib import Path
from typing import Any

from docker.errors import DockerException, ImageNotFound

from squall.cluster.errors import ImageError
from squall.cluster.image import (
    BOOTSTRAP_SUITE,
    CONTAINERS_DIR,
    DEBOOTSTRAP_SCRIPT,
    check_mirror,
    debian_mirror,
    digest,
)

logger = logging.getLogger(__name__)

ROOT_REPO = "squall-dind-root"
NODE_REPO = "squall-dind-node"
RECIPE_DIR = CONTAINERS_DIR / "dind-node"
RECIPE_FILES = ("Dockerfile", "entrypoint.sh")
#: What the node needs: its engine (with containerd, runc and tini as dependencies), iptables for
#: the engine's and the overlay's rules, and the tools the entrypoint and the checks use.
PACKAGES = ("docker.io", "iptables", "iproute2", "procps", "ca-certificates", "kmod")


def root_tag() -> str:
    """The debootstrap root's tag: a hash of the script, the suite and the package list."""
    return f"{ROOT_REPO}:" + digest([DEBOOTSTRAP_SCRIPT.read_bytes(), BOOTSTRAP_SUITE, " ".join(PACKAGES)])


def node_tag() -> str:
    """The node image's tag: a hash of the root's tag and the recipe files."""
    return f"{NODE_REPO}:" + digest([root_tag(), *((RECIPE_DIR / f).read_bytes() for f in RECIPE_FILES)])


def _present(client: Any, tag: str) -> bool:
    try:
        client.images.get(tag)
    except ImageNotFound:
        return False
    return True


def _build_root(tag: str) -> None:
    mirror = debian_mirror()
    check_mirror(mirror)
    logger.info("building %s with debootstrap (%s + %s; a few minutes)", tag, BOOTSTRAP_SUITE, ", ".join(PACKAGES))
    proc = subprocess.run(["bash", str(DEBOOTSTRAP_SCRIPT), tag, BOOTSTRAP_SUITE, mirror, ",".join(PACKAGES)],
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ImageError(f"debootstrap of the Docker-in-Docker root {tag} failed: {proc.stderr.strip()[-2000:]}")


def ensure_node_image(client: Any) -> str:
    """The node image's tag, built now (root first) if it is missing.

    :raises ImageError: the Debian mirror does not answer, debootstrap or the build failed.
    """
    tag = node_tag()
    if _present(client, tag):
        return tag
    root = root_tag()
    if not _present(client, root):
        _build_root(root)
    with tempfile.TemporaryDirectory(prefix="squall-dind-") as tmp:
        for name in RECIPE_FILES:
            (Path(tmp) / name).write_bytes((RECIPE_DIR / name).read_bytes())
        logger.info("building %s on %s", tag, root)
        try:
            client.images.build(path=tmp, tag=tag, buildargs={"BASE": root}, rm=True, forcerm=True,
                                labels={"squall.image": "dind-node"})
        except DockerException as exc:
            raise ImageError(f"building the Docker-in-Docker node image {tag} failed: {exc}") from exc
    return tag
