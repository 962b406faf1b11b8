"""The worker image recipe: apt mirror discovery and input hashing (pure; no Docker)."""

from __future__ import annotations

from pathlib import Path

import pytest

from squall.cluster import image
from squall.cluster.errors import ImageError

DEB822 = """Types: deb
URIs: http://mirror-a.invalid/debian
Suites: bookworm bookworm-updates
Components: main

Types: deb-src
URIs: http://src.invalid/debian
Suites: bookworm

Types: deb
URIs: http://security.invalid/debian-security
Suites: bookworm-security
"""


def test_parse_deb822_and_one_line_sources() -> None:
    one_line = "# comment\ndeb [arch=amd64 signed-by=/k.gpg] http://mirror-b.invalid/debian bookworm main\n"
    sources = image.parse_apt_sources([("debian.sources", DEB822), ("extra.list", one_line)])
    assert [(s.uri, s.suites) for s in sources] == [
        ("http://mirror-a.invalid/debian", ("bookworm", "bookworm-updates")),
        ("http://security.invalid/debian-security", ("bookworm-security",)),
        ("http://mirror-b.invalid/debian", ("bookworm",)),
    ]


def test_apt_mirror_reads_the_machine_configuration(tmp_path: Path) -> None:
    (tmp_path / "sources.list.d").mkdir()
    (tmp_path / "sources.list.d" / "debian.sources").write_text(DEB822)
    assert image.apt_mirror("bookworm", etc=tmp_path) == "http://mirror-a.invalid/debian"
    with pytest.raises(ImageError, match="no apt source for Debian 'trixie'"):
        image.apt_mirror("trixie", etc=tmp_path)


def test_worker_tag_is_a_hash_of_its_inputs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    dockerfile, reqs = tmp_path / "Dockerfile", tmp_path / "requirements.txt"
    dockerfile.write_text("FROM x\n")
    reqs.write_text("numpy==1\n")
    monkeypatch.setattr(image, "DOCKERFILE", dockerfile)
    monkeypatch.setattr(image, "REQUIREMENTS", reqs)
    first = image.worker_tag("base-a")
    assert first == image.worker_tag("base-a")
    assert first.startswith("squall-worker:")
    assert image.worker_tag("base-b") != first
    reqs.write_text("numpy==2\n")
    assert image.worker_tag("base-a") != first


def test_no_mirror_address_is_written_in_the_repository() -> None:
    for path in [image.DOCKERFILE, image.REQUIREMENTS, image.DEBOOTSTRAP_SCRIPT]:
        assert "deb.debian.org" not in path.read_text()
        assert "http://" not in path.read_text()
