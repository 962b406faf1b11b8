"""netem's netlink options: exact bytes, pyroute2 reads them back, distribution tables are standardised."""

from __future__ import annotations

import hashlib
import itertools
import statistics
import struct

import pytest

from squall.profiles import Chance, GilbertElliott, LinkSpec
from squall.shaping import Endpoint, LinkState
from squall.shaping.kernel import netlink
from squall.shaping.netem import wire as w
from squall.shaping.netem.backend import duplication_by_tee
from squall.shaping.netem.leaf import Netem
from squall.shaping.netem.plan import plan_netem
from squall.shaping.planning.ops import QdiscOp, RuleOp
from tests.unit.shaping_pins import NAMES, written

U = 0xFFFFFFFF


def attrs(data: bytes) -> dict[int, bytes]:
    """Top-level attributes after the 24-byte qopt."""
    out, off = {}, 24
    while off < len(data):
        length, kind = struct.unpack_from("=HH", data, off)
        out[kind] = data[off + 4 : off + length]
        off += (length + 3) & ~3
    return out


def test_plain_delay() -> None:
    data = w.netem_options(Netem(delay_us=5000, limit=20_000))
    assert struct.unpack_from("=6I", data) == (5_000_000 >> 6, 20_000, 0, 0, 0, 0)
    got = attrs(data)
    assert set(got) == {w.TCA_NETEM_LATENCY64, w.TCA_NETEM_JITTER64, w.TCA_NETEM_CORR, w.TCA_NETEM_REORDER}
    assert struct.unpack("=q", got[w.TCA_NETEM_LATENCY64]) == (5_000_000,)
    assert struct.unpack("=q", got[w.TCA_NETEM_JITTER64]) == (0,)
    assert struct.unpack("=3I", got[w.TCA_NETEM_CORR]) == (0, 0, 0)
    assert struct.unpack("=2I", got[w.TCA_NETEM_REORDER]) == (0, 0)


def test_every_message_carries_the_whole_spec() -> None:
    # A real kernel's netem_change keeps the correlations, the reorder probability and the delay
    # table that a message leaves out, so a link changed from a correlated, reordering, normal-jitter
    # setting to a plain uniform one must be told zeros and a uniform table, not nothing.
    before = Netem(delay_us=10_000, jitter_us=2000, distribution="normal", delay_corr=0.3, reorder=0.05,
                   reorder_corr=0.1)
    after = Netem(delay_us=10_000, jitter_us=2000)  # uniform, uncorrelated, in order
    old, new = attrs(w.netem_options(before)), attrs(w.netem_options(after))
    assert set(old) == set(new)  # nothing the first message set is left out of the second
    assert struct.unpack("=3I", new[w.TCA_NETEM_CORR]) == (0, 0, 0)
    assert struct.unpack("=2I", new[w.TCA_NETEM_REORDER]) == (0, 0)
    table = struct.unpack(f"={len(new[w.TCA_NETEM_DELAY_DIST]) // 2}h", new[w.TCA_NETEM_DELAY_DIST])
    assert table == w.distribution_table("uniform") != w.distribution_table("normal")


def test_the_uniform_table_is_netems_own_uniform_law() -> None:
    # netem adds table[r] x jitter / 8192: the table spans [-8192, 8192) evenly, as netem's table-free
    # uniform draw spans [-jitter, jitter), standard deviation jitter / sqrt(3)
    table = [v / w.NETEM_DIST_SCALE for v in w.distribution_table("uniform")]
    assert len(table) == w.DIST_TABLE_SIZE and table == sorted(table)
    assert -1 <= table[0] < -0.999 and 0.999 < table[-1] <= 1
    steps = {round(b - a, 6) for a, b in itertools.pairwise(table)}
    assert steps <= {round(2 / 4096, 6), round(2 / 4096 - 1 / 8192, 6), round(2 / 4096 + 1 / 8192, 6)}
    assert abs(statistics.fmean(table)) < 1e-3
    assert statistics.pstdev(table) == pytest.approx(1 / 3**0.5, rel=1e-3)
    assert w.TCA_NETEM_DELAY_DIST not in attrs(w.netem_options(Netem(delay_us=1000)))  # no jitter, no table


def test_everything() -> None:
    netem = Netem(
        delay_us=20_000,
        jitter_us=3000,
        distribution="normal",
        delay_corr=0.25,
        loss=0.01,
        loss_corr=0.5,
        duplicate=0.02,
        duplicate_corr=0.1,
        reorder=0.05,
        reorder_corr=0.2,
        limit=100_000,
    )
    data = w.netem_options(netem)
    latency, limit, loss, gap, dup, jitter = struct.unpack_from("=6I", data)
    assert (latency, limit, gap, jitter) == (312_500, 100_000, 1, 46_875)
    assert loss == round(0.01 * U) and dup == round(0.02 * U)
    got = attrs(data)
    assert struct.unpack("=3I", got[w.TCA_NETEM_CORR]) == (round(0.25 * U), round(0.5 * U), round(0.1 * U))
    assert struct.unpack("=2I", got[w.TCA_NETEM_REORDER]) == (round(0.05 * U), round(0.2 * U))
    table = struct.unpack(f"={len(got[w.TCA_NETEM_DELAY_DIST]) // 2}h", got[w.TCA_NETEM_DELAY_DIST])
    assert table == w.distribution_table("normal") and len(table) == 4096
    assert w.TCA_NETEM_LOSS not in got


def test_gemodel_sends_h_as_one_minus_loss_bad() -> None:
    netem = Netem(delay_us=1000, gemodel=GilbertElliott(0.005, 0.2, 0.8, 0.01), loss=0.0)
    data = w.netem_options(netem)
    assert struct.unpack_from("=6I", data)[2] == 0  # no random loss alongside
    nested = attrs(data)[w.TCA_NETEM_LOSS]
    length, kind = struct.unpack_from("=HH", nested)
    assert (length, kind) == (20, w.NETEM_LOSS_GE)
    p, r, h, k1 = struct.unpack_from("=4I", nested, 4)
    assert (p, r, h, k1) == (round(0.005 * U), round(0.2 * U), round(0.2 * U), round(0.01 * U))


def test_pyroute2_decodes_our_options() -> None:
    from pyroute2.netlink.rtnl.tcmsg import sched_netem

    data = w.netem_options(Netem(delay_us=10_000, jitter_us=1000, loss=0.03, duplicate=0.01, limit=5000))
    msg = sched_netem.options(struct.pack("=HH", 4 + len(data), 2) + data)
    msg.decode()
    assert (msg["delay"], msg["limit"], msg["jitter"]) == (156_250, 5000, 15_625)
    assert msg["loss"] == round(0.03 * U)


def test_qdisc_message_layout() -> None:
    msg = netlink.qdisc_message(index=7, handle=0x1010000, parent=0x10101, kind="netem", options=b"\1" * 24,
                                flags=netlink.create_flags(), seq=9)
    length, kind, flags, seq, pid = struct.unpack_from("=IHHII", msg)
    assert (length, kind, flags, seq, pid) == (len(msg), netlink.RTM_NEWQDISC, 0x605, 9, 0)
    assert struct.unpack_from("=BBHiIII", msg, 16) == (0, 0, 0, 7, 0x1010000, 0x10101, 0)
    assert msg[36:48] == struct.pack("=HH", 10, netlink.TCA_KIND) + b"netem\0\0\0"
    assert struct.unpack_from("=HH", msg, 48) == (28, netlink.TCA_OPTIONS)


def test_probabilities_and_ticks() -> None:
    assert w.prob_u32(0) == 0 and w.prob_u32(1) == U and w.prob_u32(0.5) == 2**31
    assert w.ticks(1) == 15 and w.ticks(10**9) == U  # 64 ns ticks, saturating


@pytest.mark.parametrize("name", ["normal", "pareto", "paretonormal"])
def test_tables_are_standardised(name: str) -> None:
    table = [v / w.NETEM_DIST_SCALE for v in w.distribution_table(name)]
    assert len(table) == 4096 and table == sorted(table)
    # 16-bit entries cut every tail at 4 sd (as iproute2's tables do): pareto's heavy tail loses most
    spread = {"normal": 0.99, "paretonormal": 0.93, "pareto": 0.7}[name]
    assert abs(statistics.fmean(table)) < 0.1
    assert spread < statistics.pstdev(table) <= 1.0
    assert max(table) <= 32767 / 8192


def test_pareto_is_skewed_right() -> None:
    table = w.distribution_table("pareto")
    assert table[0] > -2 * w.NETEM_DIST_SCALE and table[-1] == 32767


def test_duplication_leaves_netem_for_tee_in_the_sender() -> None:
    # Debian's 6.1.192 refuses a duplicating netem in a tree with another netem (EINVAL, seen in the
    # netem VM), and a node with two shaped destinations has two netem leaves: TEE duplicates instead.
    eps = {i: Endpoint(i, f"10.9.0.{i + 2}", f"/proc/{i + 100}/ns/net") for i in range(3)}
    dup = LinkSpec(delay_us=3000, duplicate=Chance(0.2))
    state = LinkState({(s, d): dup if (s, d) != (1, 2) else LinkSpec(delay_us=3000, duplicate=Chance(0.05, 0.5))
                       for s in eps for d in eps if s != d})
    plans = duplication_by_tee(plan_netem(list(eps.values()), state), eps, state)
    netems = {i: [op.qdisc for op in plans[i].tc if isinstance(op, QdiscOp) and isinstance(op.qdisc, Netem)]
              for i in eps}
    assert [n.duplicate for n in netems[0]] == [0.0, 0.0]  # both of node 0's leaves: no netem duplication
    assert all(n.delay_us == 3000 for ns in netems.values() for n in ns)  # the rest of the spec is kept
    assert plans[0].rules == (RuleOp("POSTROUTING", "TEE", "10.9.0.3", probability=0.2),
                              RuleOp("POSTROUTING", "TEE", "10.9.0.4", probability=0.2))
    # a correlated duplication stays with netem (iptables draws independently), with no TEE for it
    assert sorted(n.duplicate for n in netems[1]) == [0.0, 0.05]
    assert [r.peer for r in plans[1].rules if r.action == "TEE"] == ["10.9.0.2"]
    quiet = LinkState({(s, d): LinkSpec(delay_us=1000) for s in eps for d in eps if s != d})
    plain = plan_netem(list(eps.values()), quiet)
    assert duplication_by_tee(plain, eps, quiet) == plain


# sha256 (first 32 hex digits) of the whole TCA_OPTIONS payload, and its 24-byte tc_netem_qopt
PINNED = {
    "lan": ("44bad23961290546b2a34d537417fcb0", "1a0600001027000000000000000000000000000038010000"),
    "lossy-1pct": ("97c78acda6b22fb72ac2d7ff462f0e64", "2d31010010270000295c8f02000000000000000000000000"),
    "bursty-loss": ("210ce9423073a8bd28b3fb52c3303d71", "5a6202001027000000000000000000000000000000000000"),
    "wan-50ms-100mbit": ("1b5a31bb0e0b1bc9ff106261f4065ad8", "c2eb0b0010270000000000000000000000000000127a0000"),
    "odd-percentages": ("a595856a010f4d2974fdc6681d703d5f", "3fab010009030000a69bc4000100000000000000584f0000"),
    "gemodel-ties": ("1fc150385d0f0e2c5682ed8327e35940", "127a00001027000000000000000000000000000000000000"),
    "gemodel-70": ("496437d07dd6b6ff1fce7facea042503", "093d0000102700000000000000000000000000004f120000"),
}


@pytest.mark.parametrize("name", NAMES)
def test_profiles_encode_to_the_pinned_bytes(name: str) -> None:
    options = written(name).netem.options()
    assert (hashlib.sha256(options).hexdigest()[:32], options[:24].hex()) == PINNED[name]


def test_the_odd_percentages_keep_their_tee_rule() -> None:
    assert written("odd-percentages").tee == tuple(
        f"-d {ip}/32 -m statistic --mode random --probability 0.0070000000 -j TEE --gateway {ip}"
        for ip in ("10.9.0.3", "10.9.0.4"))


@pytest.mark.parametrize(("name", "h"), [("gemodel-ties", 429_496_730), ("gemodel-70", 1_288_490_188)])
def test_gemodel_h_rounds_its_ties_as_before(name: str, h: int) -> None:
    # h x (2^32 - 1) is 429496729.5 for 1-h = 90 % and 1288490188.5 for 70 %: 1 - loss_bad in floating
    # point would land on the other neighbour; w.complement keeps what the kernel was always sent
    nested = attrs(written(name).netem.options())[w.TCA_NETEM_LOSS]
    assert struct.unpack_from("=4I", nested, 4)[2] == h
