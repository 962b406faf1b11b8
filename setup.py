"""Build hook: the wheel carries Squall's assets as package data (metadata lives in pyproject.toml).

The checkout keeps ``netem_profiles/``, ``containers/``, ``matrices/`` and ``claims.yaml`` at its
top level, where users and the docs expect them. When a wheel is built, they are copied into
``squall/_assets/`` of the build, so an installed Squall finds them through its own package
(``squall/assets.py``) instead of a checkout it may not have. The downloaded wheels of the image
(``containers/.wheelhouse``) and build leftovers are never packaged. An editable install
(``pip install -e .``) does not run this: it reads the checkout's folders directly.
"""

from __future__ import annotations

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

HERE = Path(__file__).resolve().parent
# Keep in step with squall/assets.py (ASSET_DIRS, ASSET_FILES, PACKAGED_DIR, EXCLUDED);
# tests/unit/test_assets.py checks that they agree.
ASSET_DIRS = ("netem_profiles", "containers", "matrices")
ASSET_FILES = ("claims.yaml",)
PACKAGED_DIR = "_assets"
EXCLUDED = (".wheelhouse", ".build", "__pycache__")


class BuildWithAssets(build_py):  # type: ignore[misc]
    """``build_py`` that also copies the top-level assets into ``squall/_assets``."""

    def run(self) -> None:
        super().run()
        if self.editable_mode:  # editable installs read the checkout's folders
            return
        target = Path(self.build_lib) / "squall" / PACKAGED_DIR
        shutil.rmtree(target, ignore_errors=True)
        target.mkdir(parents=True)
        for name in ASSET_DIRS:
            source = HERE / name
            if not source.is_dir():
                raise FileNotFoundError(f"cannot build the wheel: the asset folder {source} is missing")
            shutil.copytree(source, target / name, ignore=shutil.ignore_patterns(*EXCLUDED))
        for name in ASSET_FILES:
            shutil.copy2(HERE / name, target / name)


setup(cmdclass={"build_py": BuildWithAssets})
