"""Which Squall images are stale, and removing them (``squall image prune``).

Apart from :mod:`.image` because it must know every image Squall builds: the worker and its base
(:mod:`.image`), the swarm node agent (:mod:`.swarm.agent_image`) and the Docker-in-Docker node
images (:mod:`.swarm.dind_image`), which themselves build on :mod:`.image`. Here, nothing imports
this module back, so the images form no import circle.
"""

from __future__ import annotations

import logging
from typing import Any

from docker.errors import DockerException

from squall.cluster.image import BASE_REPO, WORKER_REPO, choose_base, current_worker_tag
from squall.cluster.swarm import dind_image
from squall.cluster.swarm.agent_image import REPO as AGENT_REPO
from squall.cluster.swarm.agent_image import agent_tag

logger = logging.getLogger(__name__)


def stale_images(client: Any) -> list[str]:
    """Squall images built for inputs that are no longer current (left by earlier builds): the
    worker, its base, the swarm node agent, and the Docker-in-Docker node images (whose tags hash
    their own recipes, not the worker's inputs)."""
    keep: set[str] = set()
    repos = {WORKER_REPO, BASE_REPO, AGENT_REPO}
    try:
        keep |= {dind_image.root_tag(), dind_image.node_tag()}
        repos |= {dind_image.ROOT_REPO, dind_image.NODE_REPO}
    except OSError as exc:  # the node recipe is not there: which node image is current is unknown
        logger.debug("node images left alone: %s", exc)
    current = current_worker_tag(client)
    if current is not None:
        keep.add(current)
        keep.add(choose_base(client).tag)
        keep.add(agent_tag(current))  # the swarm engine's node agent, built on the current worker image
    stale = []
    for img in client.images.list(filters={"dangling": False}):
        for tag in img.tags:
            if tag.split(":")[0] in repos and tag not in keep:
                stale.append(tag)
    return sorted(stale)


def prune_images(client: Any, *, dry_run: bool = False) -> tuple[list[str], list[str]]:
    """Remove :func:`stale_images`; returns (removed, errors). An image still in use is kept."""
    removed: list[str] = []
    errors: list[str] = []
    for tag in stale_images(client):
        if dry_run:
            removed.append(tag)
            continue
        try:
            client.images.remove(tag)
            removed.append(tag)
        except DockerException as exc:
            errors.append(f"{tag}: {exc}")
    return removed, errors
