"""Assets are found through the package: the checkout's folders, or a wheel's package data (squall/assets.py).

The wheel layout is rebuilt in a temporary ``site-packages`` (a ``harness`` package with
``_assets/`` and a ``protocols`` package), so these tests need no build; the real wheel is built
and installed by ``tests/integration/test_wheel_install.py``.
"""

from __future__ import annotations

import argparse
import ast
import os
import subprocess
import sys
from pathlib import Path

import pytest

from squall import assets
from squall.cli.profiles import EXIT_BROKEN_PIPE, EXIT_ENVIRONMENT, cmd_list
from squall.cluster import image
from squall.cluster.errors import ImageError

REPO = Path(__file__).resolve().parents[2]


def _setup_constants() -> dict[str, object]:
    """The module-level constants of setup.py, read without running it."""
    tree = ast.parse((REPO / "setup.py").read_text())
    found: dict[str, object] = {}
    for node in tree.body:
        if isinstance(node, ast.Assign) and len(node.targets) == 1 and isinstance(node.targets[0], ast.Name):
            try:
                found[node.targets[0].id] = ast.literal_eval(node.value)
            except ValueError:
                continue
    return found


def test_setup_packages_what_the_locator_looks_for() -> None:
    constants = _setup_constants()
    assert constants["ASSET_DIRS"] == assets.ASSET_DIRS
    assert constants["ASSET_FILES"] == assets.ASSET_FILES
    assert constants["PACKAGED_DIR"] == assets.PACKAGED_DIR
    assert constants["EXCLUDED"] == assets.EXCLUDED
    for name in (*assets.ASSET_DIRS, *assets.ASSET_FILES):
        assert (REPO / name).exists(), name
    manifest = (REPO / "MANIFEST.in").read_text()
    for name in assets.ASSET_DIRS:
        assert f"recursive-include {name} *" in manifest
    assert "prune containers/.wheelhouse" in manifest


def test_a_checkout_uses_its_own_folders() -> None:
    assert assets.layout() == "checkout"
    assert assets.checkout_root() == REPO
    assert assets.profiles_dir() == REPO / "netem_profiles"
    assert assets.containers_dir() == REPO / "containers"
    assert assets.matrices_dir() == REPO / "matrices"
    assert assets.claims_file() == REPO / "claims.yaml"
    assert assets.wheelhouse() == REPO / "containers" / ".wheelhouse"
    assert assets.code_root() == REPO  # mounted at /squall/src as before
    assert image.DOCKERFILE == REPO / "containers" / "worker.Dockerfile"


def _fake_wheel(root: Path) -> Path:
    """A site-packages holding an installed Squall: the squall package with its _assets."""
    site = root / "site-packages"
    packaged = site / "squall" / assets.PACKAGED_DIR
    (packaged / "netem_profiles").mkdir(parents=True)
    (packaged / "netem_profiles" / "lan.yaml").write_text("name: lan\n")
    (packaged / "containers" / "base").mkdir(parents=True)
    (packaged / "containers" / "worker.Dockerfile").write_text("FROM x\n")
    (packaged / "matrices").mkdir()
    (packaged / "matrices" / "ci.yaml").write_text("protocols: [x]\n")
    (packaged / "claims.yaml").write_text("claims: []\n")
    (site / "squall" / "__init__.py").write_text("")
    (site / "squall" / "sub").mkdir(parents=True)
    (site / "squall" / "sub" / "mod.py").write_text("X = 1\n")
    (site / "squall" / "__pycache__").mkdir()
    (site / "squall" / "__pycache__" / "junk.pyc").write_bytes(b"\0")
    (site / "torch").mkdir()  # what must never reach the containers
    return site


@pytest.fixture
def wheel(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    site = _fake_wheel(tmp_path)
    monkeypatch.setattr(assets, "package_dir", lambda: site / "squall")
    monkeypatch.setenv(assets.CACHE_ENV, str(tmp_path / "cache"))
    return site


def test_a_wheel_uses_its_package_data(wheel: Path, tmp_path: Path) -> None:
    packaged = wheel / "squall" / assets.PACKAGED_DIR
    assert assets.layout() == "wheel"
    assert assets.checkout_root() is None
    assert assets.profiles_dir() == packaged / "netem_profiles"
    assert assets.containers_dir() == packaged / "containers"
    assert assets.claims_file() == packaged / "claims.yaml"
    assert assets.require("containers/worker.Dockerfile") == packaged / "containers" / "worker.Dockerfile"
    assert assets.wheelhouse() == tmp_path / "cache" / "wheelhouse"  # writable, outside the package
    assert assets.find_matrix("ci") == packaged / "matrices" / "ci.yaml"
    assert assets.matrix_names() == ["ci"]


def test_a_wheel_mounts_a_staged_copy_of_its_code_only(wheel: Path, tmp_path: Path) -> None:
    staged = assets.code_root()
    assert staged.parent == tmp_path / "cache" / "code"
    assert (staged / "squall" / "sub" / "mod.py").read_text() == "X = 1\n"
    assert sorted(p.name for p in staged.iterdir()) == ["squall"]  # no torch
    assert not (staged / "squall" / "__pycache__").exists()
    assert not (staged / "squall" / assets.PACKAGED_DIR).exists()  # the assets stay on the host
    assert assets.code_root() == staged  # staged once per content
    assert len(list(staged.parent.iterdir())) == 1
    (wheel / "squall" / "sub" / "mod.py").write_text("X = 22\n")  # an upgrade: new content, new copy
    restaged = assets.code_root()
    assert restaged != staged
    assert (restaged / "squall" / "sub" / "mod.py").read_text() == "X = 22\n"


def test_a_missing_asset_names_where_it_looked(wheel: Path) -> None:
    with pytest.raises(assets.AssetError) as caught:
        assets.require("containers/requirements.txt")
    message = str(caught.value)
    assert "'containers/requirements.txt' is missing" in message
    assert str(wheel / "squall" / assets.PACKAGED_DIR / "containers" / "requirements.txt") in message
    assert "reinstall" in message


def test_nothing_installed_is_a_missing_layout(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    (tmp_path / "squall").mkdir()
    monkeypatch.setattr(assets, "package_dir", lambda: tmp_path / "squall")
    assert assets.layout() == "missing"
    assert assets.profiles_dir() == tmp_path / "squall" / assets.PACKAGED_DIR / "netem_profiles"
    with pytest.raises(assets.AssetError, match=r"claims\.yaml' is missing"):
        assets.require("claims.yaml")


def test_a_missing_recipe_is_an_environment_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(image, "CONTAINERS_DIR", tmp_path / "containers")
    monkeypatch.setattr(image, "DOCKERFILE", tmp_path / "containers" / "worker.Dockerfile")
    with pytest.raises(ImageError, match=r"'containers/worker\.Dockerfile' is missing"):
        image.worker_tag("base")


def test_matrices_by_name_or_path(tmp_path: Path) -> None:
    assert assets.find_matrix("ci") == REPO / "matrices" / "ci.yaml"
    assert {"ci", "demo", "full"} <= set(assets.matrix_names())
    own = tmp_path / "mine.yaml"
    own.write_text("protocols: [x]\n")
    assert assets.find_matrix(str(own)) == own
    assert assets.find_matrix(own) == own
    with pytest.raises(FileNotFoundError, match=r"no matrix named 'nope' .*shipped: .*ci"):
        assets.find_matrix("nope")
    with pytest.raises(FileNotFoundError, match="no such file"):
        assets.find_matrix(str(tmp_path / "absent.yaml"))


def test_an_empty_profile_list_is_an_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                           capsys: pytest.CaptureFixture[str]) -> None:
    from squall.profiles import loader

    monkeypatch.setattr(loader, "PROFILE_DIR", tmp_path / "none")
    monkeypatch.delenv(loader.PATH_ENV, raising=False)
    assert cmd_list(argparse.Namespace(json=False)) == EXIT_ENVIRONMENT
    captured = capsys.readouterr()
    assert captured.out == ""
    assert "no network profiles found" in captured.err
    assert str(tmp_path / "none") in captured.err


@pytest.mark.parametrize("module", ["squall.cli.main", "squall.cli.profiles"])
def test_a_closed_pipe_ends_quietly(module: str) -> None:
    """``squall profiles list | head``: the reader is gone before the first write (deterministic)."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        proc = subprocess.run([sys.executable, "-m", module, "profiles", "list"], stdout=write_end,
                              stderr=subprocess.PIPE, text=True, cwd=REPO, timeout=120, check=False)
    finally:
        os.close(write_end)
    assert proc.returncode == EXIT_BROKEN_PIPE, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "BrokenPipeError" not in proc.stderr
