"""The debootstrap base of the worker image on a host whose apt sources are not Debian 12 (issue 40, item 2).

The host is made to look like Ubuntu 24.04 to the build: in a private mount namespace, ``/etc/apt`` is
replaced by a folder holding only Ubuntu noble's sources (no bookworm anywhere), and the base is built
there with :func:`squall.cluster.image.build_debootstrap_base` under a throw-away tag. It must come from
the Debian mirror Squall chooses (``SQUALL_DEBIAN_MIRROR``, default deb.debian.org), hold Debian 12's
Python 3.11 with venv, and is removed afterwards. A minute or two: debootstrap downloads and unpacks
about 40 MB of packages.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import textwrap
import uuid
from pathlib import Path
from typing import Any

import pytest

from squall.cluster.engine import in_ci
from squall.cluster.image import BASE_REPO

REPO = Path(__file__).resolve().parents[2]
UBUNTU_SOURCES = """Types: deb
URIs: http://archive.ubuntu.com/ubuntu/
Suites: noble noble-updates noble-backports
Components: main restricted universe multiverse
Signed-By: /usr/share/keyrings/ubuntu-archive-keyring.gpg
"""


@pytest.mark.docker
@pytest.mark.slow
@pytest.mark.timeout(900)
def test_the_base_builds_from_squalls_mirror_where_apt_knows_no_bookworm(tmp_path: Path, docker_client: Any) -> None:
    if os.geteuid() != 0 or shutil.which("unshare") is None:
        pytest.fail("needs root and unshare") if in_ci() else pytest.skip("needs root and unshare")
    apt = tmp_path / "apt"
    (apt / "sources.list.d").mkdir(parents=True)
    (apt / "sources.list").write_text("# see sources.list.d\n")
    (apt / "sources.list.d" / "ubuntu.sources").write_text(UBUNTU_SOURCES)
    tag = f"{BASE_REPO}:test-{uuid.uuid4().hex[:8]}"
    program = textwrap.dedent(f"""
        import pathlib
        from squall.cluster.image import build_debootstrap_base, debian_mirror
        seen = "".join(p.read_text() for p in pathlib.Path("/etc/apt").rglob("*") if p.is_file())
        assert "noble" in seen and "bookworm" not in seen, seen  # what the build sees of the host's apt
        print("mirror", debian_mirror())
        build_debootstrap_base({tag!r})
    """)
    script = f'mount --bind "{apt}" /etc/apt && exec "{sys.executable}" -c "$0"'
    env = {k: v for k, v in os.environ.items() if k != "SQUALL_DEBIAN_MIRROR"}
    env["PYTHONPATH"] = str(REPO)
    try:
        proc = subprocess.run(["unshare", "--mount", "--propagation", "private", "bash", "-c", script, program],
                              env=env, capture_output=True, text=True, timeout=800, check=False)
        assert proc.returncode == 0, (proc.stdout + proc.stderr)[-4000:]
        assert "mirror http://deb.debian.org/debian" in proc.stdout
        out = docker_client.containers.run(tag, ["bash", "-c", ". /etc/os-release; echo $VERSION_CODENAME; "
                                                 "python3 -c 'import sys, venv; print(*sys.version_info[:2])'"],
                                           remove=True, network_mode="none").decode().split()
        assert out == ["bookworm", "3", "11"], out
    finally:
        try:
            docker_client.images.remove(tag, force=True)
        except Exception as exc:  # the build failed before the import: nothing to remove
            print(f"not removed: {tag}: {exc}")
