"""Access to the Docker engine: the only place that creates a Docker client."""

from __future__ import annotations

import logging
import os
from typing import Any

import docker
import requests
from docker.errors import DockerException

from squall.cluster.errors import EngineUnavailable

logger = logging.getLogger(__name__)

#: Timeout (seconds) of every Docker API call; container start/stop calls pass their own.
API_TIMEOUT = 120

#: What a Docker API call raises when it fails. docker-py wraps the engine's answers in
#: ``DockerException`` but lets ``requests``' errors through when the engine goes away in the middle
#: of a session (stopped, restarted: "Connection aborted", "Connection refused", a read timeout).
ENGINE_ERRORS: tuple[type[Exception], ...] = (DockerException, requests.exceptions.RequestException)


def in_ci() -> bool:
    """True when running under CI (``CI=true``): missing prerequisites are failures, not skips."""
    return os.environ.get("CI", "").strip().lower() in {"1", "true", "yes"}


def docker_client() -> Any:
    """A Docker client for ``DOCKER_HOST`` or the local socket, checked with a ping.

    :raises EngineUnavailable: when no engine answers, with what to do about it.
    """
    try:
        client = docker.from_env(timeout=API_TIMEOUT)
        client.ping()
    except DockerException as exc:
        where = os.environ.get("DOCKER_HOST", "the local socket /var/run/docker.sock")
        raise EngineUnavailable(
            f"no Docker engine answers at {where} ({exc}); run 'scripts/ensure-docker.sh' "
            "(or 'make docker') to install or start one"
        ) from exc
    return client
