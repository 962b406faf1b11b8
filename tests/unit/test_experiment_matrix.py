"""Matrix building: cells, ids, and clear errors for bad input (pure)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from squall.experiment.matrix import Cell, MatrixError, build_matrix, load_matrix, load_matrix_file

KNOWN = ["ring", "butterfly", "dpsgd"]


def test_cells_and_readable_ids() -> None:
    m = build_matrix({"protocols": "ring,butterfly", "profiles": ["wan-5ms", "lan"], "workers": 8}, source="cli",
                     known_protocols=KNOWN)
    assert m.ids() == ["ring-wan_5ms-w8", "butterfly-wan_5ms-w8", "ring-lan-w8", "butterfly-lan-w8"]
    seeded = build_matrix({"protocols": ["ring"], "profiles": ["lan"], "workers": [4], "seeds": [0, 1]},
                          source="cli", known_protocols=KNOWN)
    assert seeded.ids() == ["ring-lan-w4-s0", "ring-lan-w4-s1"]
    assert Cell("ring", "/x/my-profile.yaml", 2).id() == "ring-my_profile-w2"


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        ({"protocols": ["gossipx"], "profiles": ["lan"], "workers": [4]}, "unknown protocol 'gossipx'; allowed: "),
        ({"protocols": ["ring"], "profiles": ["no-such-profile"], "workers": [4]}, "profiles: "),
        ({"protocols": ["ring"], "profiles": ["lan"], "workers": [0]}, "workers: 0 must be an integer in 1..250"),
        ({"protocols": ["ring"], "profiles": ["lan"], "workers": ["four"]}, "'four' is not an integer"),
        ({"protocols": ["ring"], "profiles": ["lan"], "workers": [4], "speed": 1}, "unknown key(s) ['speed']"),
        ({"protocols": ["ring"], "profiles": ["lan"]}, "missing key(s) ['workers']"),
        ({"protocols": ["ring", "ring"], "profiles": ["lan"], "workers": [4]}, "duplicated entries"),
        ({"protocols": [], "profiles": ["lan"], "workers": [4]}, "must not be empty"),
        ({"protocols": ["ring"], "profiles": ["geo-2-regions"], "workers": [1]}, "needs at least 2 workers"),
    ],
)
def test_bad_matrices_name_the_key_and_what_is_allowed(raw: dict[str, Any], message: str) -> None:
    with pytest.raises(MatrixError) as info:
        build_matrix(raw, source="m.yaml", known_protocols=KNOWN)
    assert str(info.value).startswith("m.yaml: ") and message in str(info.value)


def test_load_matrix_file_errors(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    path.write_text("- just\n- a list\n")
    with pytest.raises(MatrixError, match="must be a mapping"):
        load_matrix(path, known_protocols=KNOWN)
    path.write_text("protocols: [ring\n")
    with pytest.raises(MatrixError, match="not valid YAML"):
        load_matrix(path, known_protocols=KNOWN)
    path.write_text("protocols: [ring]\nprofiles: [lan]\nworkers: [2]\n")
    assert load_matrix(path, known_protocols=KNOWN).ids() == ["ring-lan-w2"]


def test_matrix_file_calibrate_key(tmp_path: Path) -> None:
    path = tmp_path / "m.yaml"
    base = "protocols: [ring]\nprofiles: [lan]\nworkers: [2]\n"
    path.write_text(base)
    assert load_matrix_file(path, known_protocols=KNOWN).calibrate is True  # on unless the file says otherwise
    path.write_text(base + "calibrate: false\n")
    assert load_matrix_file(path, known_protocols=KNOWN).calibrate is False
    path.write_text(base + "calibrate: sometimes\n")
    with pytest.raises(MatrixError, match=r"m\.yaml: calibrate: expected true or false, got 'sometimes'"):
        load_matrix_file(path, known_protocols=KNOWN)
