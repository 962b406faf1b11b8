"""What an agent loads once, before it forks any job: the protocols' code and the shared training job.

A job is a fork of its container's agent, so whatever the agent imported is paid once per container
instead of once per job (per cell): every protocol folder's declarations (the catalog reads them all
to find one by name), the shared ``train`` job, and the digits data most protocol cells train on.
``python -m squall.worker.agent --preload torch,squall.worker.warm``. A protocol that fails to load is
only logged here: the job that needs it fails with the reason.
"""

from __future__ import annotations

import logging

logger = logging.getLogger(__name__)


def warm() -> None:
    """Import and read what every protocol job reads first."""
    try:
        from squall.protocols import train  # noqa: F401  (the shared job, imported for its imports)
        from squall.protocols.catalog import discover
        from squall.training.tasks.digits import digits_split

        discover()
        digits_split()
    except Exception as exc:  # the job that needs it says why; the agent still serves
        logger.warning("warming the agent failed (each job will load its own code): %s", exc)


warm()
