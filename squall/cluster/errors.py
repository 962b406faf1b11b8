"""Errors of the cluster layer."""

from __future__ import annotations


class ClusterError(RuntimeError):
    """A cluster could not be created, used or torn down; the message says why."""


class ClusterSpecError(ClusterError, ValueError):
    """A cluster specification is impossible (0 workers, negative CPUs, ...); nothing was created."""


class EngineUnavailable(ClusterError):
    """No Docker engine answers; the message says what to do."""


class ImageError(ClusterError):
    """The worker image is missing or could not be built."""


class JobError(ClusterError):
    """A job could not be dispatched to an agent, or the agent answered with an error."""
