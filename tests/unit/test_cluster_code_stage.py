"""Staging a third party's code for the containers (squall/cluster/code_stage.py): real files in a
temporary cache; the containers' side is tests/integration/test_short_names.py."""

from __future__ import annotations

import os
import sysconfig
from pathlib import Path

import pytest

from squall.cluster.code_stage import is_site_dir, stage


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("SQUALL_CACHE_DIR", str(tmp_path / "cache"))
    return tmp_path / "cache"


def _package(root: Path) -> tuple[Path, Path]:
    pkg = root / "mypkg"
    (pkg / "__pycache__").mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    (pkg / "proto.py").write_text("def main(ctx):\n    return {}\n")
    (pkg / "__pycache__" / "proto.cpython-311.pyc").write_bytes(b"\0")
    meta = root / "mypkg-0.1.dist-info"
    meta.mkdir()
    (meta / "entry_points.txt").write_text("[squall.protocols]\nmine = mypkg.proto:DECLARATIONS\n")
    return pkg, meta


def test_a_package_and_its_metadata_are_copied_side_by_side(tmp_path: Path, cache: Path) -> None:
    pkg, meta = _package(tmp_path / "site")
    staged = stage([pkg, meta])
    assert staged.parent == cache / "ext"
    assert sorted(p.name for p in staged.iterdir()) == ["mypkg", "mypkg-0.1.dist-info"]
    assert sorted(p.name for p in (staged / "mypkg").iterdir()) == ["__init__.py", "proto.py"]  # no bytecode
    assert (staged / "mypkg-0.1.dist-info" / "entry_points.txt").read_text().startswith("[squall.protocols]")
    assert staged.stat().st_mode & 0o755 == 0o755


def test_the_same_content_is_staged_once_and_an_edit_again(tmp_path: Path, cache: Path) -> None:
    pkg, meta = _package(tmp_path / "site")
    first = stage([pkg, meta])
    assert stage([pkg, meta]) == first
    proto = pkg / "proto.py"
    proto.write_text(proto.read_text() + "# edited\n")
    stat = proto.stat()
    os.utime(proto, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000))
    second = stage([pkg, meta])
    assert second != first and (second / "mypkg" / "proto.py").read_text().endswith("# edited\n")
    assert sorted(p.name for p in (cache / "ext").iterdir() if not p.name.startswith(".")) == sorted(
        [first.name, second.name])


def test_a_single_module_file_is_staged_too(tmp_path: Path, cache: Path) -> None:
    module = tmp_path / "solo.py"
    module.write_text("def main(ctx):\n    return {}\n")
    assert [p.name for p in stage([module]).iterdir()] == ["solo.py"]


def test_missing_or_clashing_sources_are_refused(tmp_path: Path, cache: Path) -> None:
    with pytest.raises(FileNotFoundError, match="does not exist"):
        stage([tmp_path / "absent"])
    (tmp_path / "a" / "mypkg").mkdir(parents=True)
    (tmp_path / "b" / "mypkg").mkdir(parents=True)
    with pytest.raises(ValueError, match="two of them are called the same"):
        stage([tmp_path / "a" / "mypkg", tmp_path / "b" / "mypkg"])


def test_site_packages_is_told_from_a_folder_of_ones_own(tmp_path: Path) -> None:
    assert is_site_dir(Path(sysconfig.get_paths()["purelib"]))
    assert not is_site_dir(tmp_path)
