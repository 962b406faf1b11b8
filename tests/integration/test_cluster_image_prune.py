"""`squall image prune` finds every kind of Squall image left by older inputs, and only those.

Real images on the real engine: the test gives the current base image extra tags in each Squall
repository (worker, base, node agent, and the two Docker-in-Docker node repositories) under names
no build makes, and checks that the stale list has exactly those plus whatever was stale before,
never a current tag. It removes its own tags itself (``prune_images`` would also remove any other
stale image on the machine, which is not the test's to delete) and leaves the engine as found.
"""

from __future__ import annotations

import contextlib
import os
from typing import Any

from docker.errors import ImageNotFound

from squall.cluster.image import BASE_REPO, WORKER_REPO, choose_base
from squall.cluster.image_prune import prune_images, stale_images
from squall.cluster.swarm import dind_image
from squall.cluster.swarm.agent_image import REPO as AGENT_REPO
from squall.cluster.swarm.agent_image import agent_tag

REPOS = (WORKER_REPO, BASE_REPO, AGENT_REPO, dind_image.ROOT_REPO, dind_image.NODE_REPO)


def test_stale_images_of_every_squall_repository_are_listed_and_current_ones_kept(
        docker_client: Any, worker_image: str) -> None:
    base = docker_client.images.get(choose_base(docker_client).tag)
    marker = f"stale-test-{os.getpid()}"
    ours = sorted(f"{repo}:{marker}" for repo in REPOS)
    before = set(stale_images(docker_client))
    try:
        for repo in REPOS:
            assert base.tag(repo, marker)
        stale = set(stale_images(docker_client))
        assert stale - before == set(ours), f"listed: {sorted(stale - before)}; tagged: {ours}"
        current = {worker_image, choose_base(docker_client).tag, agent_tag(worker_image),
                   dind_image.root_tag(), dind_image.node_tag()}
        assert not stale & current, f"current images listed as stale: {sorted(stale & current)}"
        removed, errors = prune_images(docker_client, dry_run=True)
        assert set(ours) <= set(removed) and not errors
        assert all(docker_client.images.get(tag) for tag in ours), "a dry run removed an image"
    finally:
        for tag in ours:
            with contextlib.suppress(ImageNotFound):
                docker_client.images.remove(tag)
    assert set(stale_images(docker_client)) == before
    assert docker_client.images.get(base.id), "removing the extra tags removed the base image"
