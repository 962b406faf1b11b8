"""Shared fixtures.

Docker-backed tests use :func:`docker_client` and :func:`worker_image`. Without an engine or the
image they are skipped on a developer's machine, but under ``CI=true`` they fail: CI must never
pass by skipping what it was meant to test.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from harness.cluster.engine import in_ci


def _missing(what: str) -> None:
    if in_ci():
        pytest.fail(f"{what} (CI=true: a missing prerequisite is a failure, not a skip)")
    pytest.skip(what)


@pytest.fixture(scope="session")
def docker_client() -> Any:
    """Name: docker_client. Scope: session. Depends: a Docker engine (make docker)."""
    from harness.cluster.engine import docker_client as make_client
    from harness.cluster.errors import EngineUnavailable

    try:
        return make_client()
    except EngineUnavailable as exc:
        _missing(str(exc))


@pytest.fixture(scope="session")
def worker_image(docker_client: Any) -> str:
    """Name: worker_image. Scope: session. Depends: docker_client and 'make image'."""
    from harness.cluster.image import current_worker_tag

    tag = current_worker_tag(docker_client)
    if tag is None:
        _missing("the worker image is not built for the current inputs: run 'make image'")
    assert tag is not None
    return tag


@pytest.fixture(scope="session", autouse=True)
def _state_dir(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """Keep run state of the tests in one short directory (Unix socket paths are limited)."""
    path = Path("/tmp") / f"sq-test-{os.getpid()}"
    path.mkdir(exist_ok=True)
    old = os.environ.get("SQUALL_STATE_DIR")
    os.environ["SQUALL_STATE_DIR"] = str(path)
    yield path
    if old is None:
        os.environ.pop("SQUALL_STATE_DIR", None)
    else:
        os.environ["SQUALL_STATE_DIR"] = old
