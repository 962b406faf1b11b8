"""iptables-restore scripts of the run's chains (pure parts)."""

from __future__ import annotations

import pytest

from squall.shaping.base import ShapingError
from squall.shaping.kernel.iptables import (
    Chains,
    fill_script,
    has_chains,
    present_jumps,
    remove_script,
    rule_args,
    sync,
)
from squall.shaping.planning.ops import RuleOp

CHAINS = Chains("r1")
RULES = [
    RuleOp("PREROUTING", "DROP", "10.0.0.2"),
    RuleOp("PREROUTING", "DROP", "10.0.0.4"),
    RuleOp("POSTROUTING", "TEE", "10.0.0.3", probability=0.05),
]


def test_rule_args() -> None:
    assert [rule_args(r) for r in RULES] == [
        "-s 10.0.0.2/32 -j DROP",
        "-s 10.0.0.4/32 -j DROP",
        "-d 10.0.0.3/32 -m statistic --mode random --probability 0.0500000000 -j TEE --gateway 10.0.0.3",
    ]


def test_install_script_declares_fills_and_jumps() -> None:
    assert fill_script(CHAINS, RULES, jumps=["PREROUTING", "POSTROUTING"]).splitlines() == [
        "*mangle",
        ":SQUALL-r1-in - [0:0]",
        ":SQUALL-r1-out - [0:0]",
        "-A SQUALL-r1-in -s 10.0.0.2/32 -j DROP",
        "-A SQUALL-r1-in -s 10.0.0.4/32 -j DROP",
        "-A SQUALL-r1-out -d 10.0.0.3/32 -m statistic --mode random --probability 0.0500000000 -j TEE "
        "--gateway 10.0.0.3",
        "-I PREROUTING 1 -j SQUALL-r1-in",
        "-I POSTROUTING 1 -j SQUALL-r1-out",
        "COMMIT",
    ]


def test_update_script_leaves_the_jumps_alone() -> None:
    script = fill_script(CHAINS, RULES[:1])
    assert "-I " not in script and ":SQUALL-r1-in - [0:0]" in script


def test_remove_script() -> None:
    assert remove_script(CHAINS, ["PREROUTING"]).splitlines() == [
        "*mangle",
        ":SQUALL-r1-in - [0:0]",
        ":SQUALL-r1-out - [0:0]",
        "-D PREROUTING -j SQUALL-r1-in",
        "-X SQUALL-r1-in",
        "-X SQUALL-r1-out",
        "COMMIT",
    ]


def test_reading_a_save() -> None:
    save = "*mangle\n:PREROUTING ACCEPT [0:0]\n:SQUALL-r1-in - [0:0]\n-A PREROUTING -j SQUALL-r1-in\nCOMMIT"
    assert present_jumps(save, CHAINS) == ["PREROUTING"]
    assert has_chains(save, CHAINS) and not has_chains(save, Chains("r2"))


@pytest.mark.parametrize("run_id", ["", "a b", "x" * 18, "semi;colon"])
def test_bad_run_ids(run_id: str) -> None:
    with pytest.raises(ShapingError, match="run id"):
        Chains(run_id)


def test_longest_run_id() -> None:
    assert len(Chains("x" * 17).name("POSTROUTING")) == 28


def test_a_namespace_with_no_rules_held_or_wanted_is_not_entered() -> None:
    """An apply without cut links, duplication or NAT must not cost a process per node (iptables-save
    under the netem VM's emulated CPU takes a good part of a second)."""
    class Untouchable:
        def entered(self) -> None:
            raise AssertionError("entered a namespace with nothing to do")

    assert sync(Untouchable(), CHAINS, None, [], 0) is None  # type: ignore[arg-type]
