"""The node agent's image: the worker image plus iptables and pyroute2, built from local material.

The worker image stays one image (the agent is a different entrypoint of the same code); the two
things shaping needs that a worker does not get are laid over it: iptables' Debian packages,
downloaded on the host with ``apt-get download`` (the same mirror the base image comes from), and
pyroute2 and the few packages the harness's own modules import (the Docker SDK, PyYAML, psutil),
copied from the environment the harness runs in. Tagged by a hash of the
worker tag and the recipe, so it is built once per change of either (a few seconds).
"""

from __future__ import annotations

import importlib.metadata
import logging
import os
import shutil
import subprocess
from pathlib import Path
from typing import Any

from squall.cluster.errors import ImageError
from squall.cluster.image import REPO_ROOT, ensure_variant_image, variant_tag

logger = logging.getLogger(__name__)

REPO = "squall-node-agent"
RECIPE_DIR = REPO_ROOT / "containers" / "node-agent"
#: iptables and the libraries the worker image lacks (Debian 12); libmnl0 and libxtables12 it has.
DEBS = ("iptables", "libip4tc2", "libip6tc2", "libnetfilter-conntrack3", "libnfnetlink0", "libnftnl11", "netbase")
#: Copied from the harness's own environment (same Python minor version and glibc as the image):
#: the agent imports squall.shaping (pyroute2, yaml through the profiles) and squall.cluster
#: (the Docker SDK and what it needs, psutil).
HOST_PACKAGES = ("pyroute2", "PyYAML", "docker", "requests", "urllib3", "certifi", "idna", "charset-normalizer",
                 "psutil")


def _prepare(context: Path) -> None:
    debs = context / "debs"
    debs.mkdir()
    download = ["apt-get", "download", "-q", *DEBS]
    try:
        try:
            subprocess.run(download, cwd=debs, check=True, capture_output=True, timeout=300)
        except subprocess.CalledProcessError:
            # a fresh machine may have no package lists yet (as root, fetch them once and retry)
            if os.geteuid() != 0:
                raise
            subprocess.run(["apt-get", "update", "-qq"], check=True, capture_output=True, timeout=600)
            subprocess.run(download, cwd=debs, check=True, capture_output=True, timeout=300)
    except (OSError, subprocess.SubprocessError) as exc:
        detail = getattr(exc, "stderr", b"") or b""
        raise ImageError(f"downloading {', '.join(DEBS)} with apt-get failed: {exc} "
                         f"{detail.decode(errors='replace')[-500:]}") from exc
    site = context / "site"
    site.mkdir()
    for name in HOST_PACKAGES:
        dist = importlib.metadata.distribution(name)
        files = dist.files or []
        for f in files:
            src = Path(str(dist.locate_file(f)))
            if ".." in f.parts or not src.is_file() or "__pycache__" in f.parts:
                continue
            dest = site / f
            dest.parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest)


def agent_tag(worker_tag: str) -> str:
    """The agent image's tag for this worker image and recipe (``squall image prune`` keeps it)."""
    return variant_tag(REPO, worker_tag, RECIPE_DIR, ("Dockerfile",))


def ensure_agent_image(client: Any) -> str:
    """The node agent's image tag, built now if it is missing.

    :raises ImageError: the worker image is not built, or a download or the build fails.
    """
    return ensure_variant_image(client, repo=REPO, recipe_dir=RECIPE_DIR, files=("Dockerfile",), prepare=_prepare)
