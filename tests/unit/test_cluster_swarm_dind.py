"""The pure parts of the two-node swarm: the emulated nodes' configuration and image tags, and
which bridge rules a node that holds only some of a run's endpoints keeps."""

from __future__ import annotations

from pathlib import Path

import pytest

from squall.cluster.swarm import dind_image
from squall.cluster.swarm.dind import DindSpec
from squall.shaping.base import ELSEWHERE_PREFIX, Endpoint, elsewhere
from squall.shaping.nfqueue import hold
from squall.shaping.nfqueue.hold_plan import HoldRule, for_receivers


@pytest.mark.parametrize(("key", "value", "allowed"), [("nodes", 0, "1 .. 8"), ("nodes", 9, "1 .. 8"),
                                                       ("nodes", True, "1 .. 8"), ("ready_timeout_s", 0, "> 0"),
                                                       ("load_timeout_s", "5", "> 0")])
def test_dind_spec_names_the_key_the_value_and_what_is_allowed(key: str, value: object, allowed: str) -> None:
    with pytest.raises(ValueError, match=rf"{key}={value!r}.*{allowed}"):
        DindSpec(**{key: value})  # type: ignore[arg-type]


def test_node_image_tag_follows_every_recipe_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in dind_image.RECIPE_FILES:
        (tmp_path / name).write_text(f"{name} v1\n")
    monkeypatch.setattr(dind_image, "RECIPE_DIR", tmp_path)
    first = dind_image.node_tag()
    assert first == dind_image.node_tag() and first.startswith("squall-dind-node:")
    (tmp_path / "entrypoint.sh").write_text("entrypoint v2\n")
    assert dind_image.node_tag() != first
    assert dind_image.root_tag().startswith("squall-dind-root:")


RULES = [HoldRule("10.0.0.2", "10.0.0.3", 1030), HoldRule("10.0.0.3", "10.0.0.2", 1025),
         HoldRule("10.0.0.4", "10.0.0.2", 1026), HoldRule("10.0.0.2", "10.0.0.5", 1040)]


def test_a_node_holds_only_the_links_its_own_receivers_get() -> None:
    mine = for_receivers(RULES, {"10.0.0.2", "10.0.0.4"})
    assert [r.queue for r in mine] == [1025, 1026]
    # two nodes together hold every link exactly once
    theirs = for_receivers(RULES, {"10.0.0.3", "10.0.0.5"})
    assert sorted(r.queue or 0 for r in (*mine, *theirs)) == sorted(r.queue or 0 for r in RULES)
    assert for_receivers(RULES, None) == tuple(RULES)
    assert for_receivers(RULES, frozenset()) == ()


def test_endpoints_on_other_machines_are_known_by_their_stand_in(tmp_path: Path) -> None:
    stand_in = tmp_path / f"{ELSEWHERE_PREFIX}abc"
    stand_in.write_text("")
    assert elsewhere(str(stand_in))
    assert not elsewhere("/proc/1/ns/net")
    with pytest.raises(Exception, match="no endpoint runs on this machine"):
        hold.bridge_namespace([Endpoint(0, "10.0.0.2", str(stand_in)), Endpoint(1, "10.0.0.3", str(stand_in))])
