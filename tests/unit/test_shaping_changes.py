"""In-place change plans, their netlink encoding, schedules and the realised timeline (pure parts)."""

from __future__ import annotations

import struct
from collections.abc import Mapping

import pytest

from squall.experiment.realised import change_records, replayed
from squall.profiles import LinkSpec, Loss, NodeLinkSpec, profile_from_data
from squall.shaping import LinkState, NotInPlace, link_timeline
from squall.shaping.base import Endpoint
from squall.shaping.clock.sender import Agenda, NamespaceRef, Schedule, ScheduleEntry
from squall.shaping.kernel.netlink import NLMSGHDR
from squall.shaping.netem.plan import needs_netem, plan_netem
from squall.shaping.nfqueue.plan import delays_in_daemon, link_params, plan_nfqueue
from squall.shaping.planning.changes import Keep, TimedState, cuts_as_loss, pairs_ever, plan_in_place
from squall.shaping.planning.ops import ClassOp, NodePlan, Pfifo, QdiscOp, handle
from squall.shaping.planning.tc_diff import TcStep
from squall.shaping.planning.tc_messages import RTM_NEWTCLASS, burst_ticks, change_message, split, with_seq

EPS = [Endpoint(i, f"10.0.0.{i + 2}", f"/proc/{100 + i}/ns/net") for i in range(3)]
PROFILE = profile_from_data({
    "name": "p", "description": "d", "links": {"default": {"delay": "2ms"}},
    "phases": [{"at": "1s", "links": {"pairs": [{"link": "0 -> 1", "delay": "30ms", "rate": "10mbit"}]}},
               {"at": "2s"}],
    "churn": {"events": [{"at": "1.5s", "kind": "link_down", "link": "1 -> 2", "duration": "1s"}]}})


def netem_planner(state: LinkState, keep: Keep) -> Mapping[int, NodePlan]:
    return plan_netem(EPS, state, keep.leaves)


def test_the_timeline_has_one_state_per_change() -> None:
    timeline = link_timeline(PROFILE, 3, 10.0)
    assert [(t.at_s, t.label) for t in timeline] == [
        (0.0, "start"), (1.0, "phase 0"), (1.5, "link_down (churn.events[0])"), (2.0, "phase 1"),
        (2.5, "link_up (churn.events[0])")]
    assert timeline[2].state.blocked == {(1, 2)}


def test_a_cut_is_a_link_that_loses_everything() -> None:
    state = cuts_as_loss(LinkState({(1, 2): LinkSpec(delay_us=5)}, blocked=frozenset({(1, 2), (2, 0)})))
    assert state.blocked == frozenset()
    assert state.links[(1, 2)] == LinkSpec(delay_us=5, loss=Loss(probability=1.0))
    assert state.links[(2, 0)].loss.probability == 1.0


@pytest.mark.parametrize("backend", ["netem", "nfqueue"])
def test_every_change_of_a_run_is_in_place(backend: str) -> None:
    timeline = link_timeline(PROFILE, 3, 10.0)
    if backend == "netem":
        planned = plan_in_place(timeline, netem_planner, Keep(leaves=pairs_ever(timeline, needs_netem)))
    else:
        keep = Keep(leaves=pairs_ever(timeline, lambda s: s.rate_bps is not None),
                    queues=pairs_ever(timeline, lambda s: delays_in_daemon(link_params(s))))
        def planner(st: LinkState, k: Keep) -> Mapping[int, NodePlan]:
            return plan_nfqueue(EPS, st, leaves=k.leaves, queues=k.queues)

        planned = plan_in_place(timeline, planner, keep)
    assert len(planned) == len(timeline)
    steps = [step for change in planned[1:] for node in change.steps.values() for step in node]
    assert steps and {step.verb for step in steps} == {"change"}
    assert planned[1].changed == ((0, 1),)
    assert planned[2].changed == ((1, 2),)
    # the rules never change: cuts are losses, not DROP rules
    assert all(p.rules == planned[0].plans[n].rules for c in planned for n, p in c.plans.items())


def test_a_tree_that_changes_shape_is_not_in_place() -> None:
    capped = [TimedState(0.0, "start", LinkState({})),
              TimedState(1.0, "cap", LinkState({}, node_links={0: NodeLinkSpec(uplink_bps=10_000_000)}))]
    with pytest.raises(NotInPlace, match="the change at 1s \\(cap\\) on node 0 needs add"):
        plan_in_place(capped, netem_planner, Keep())


def test_an_htb_class_change_is_encoded_as_the_kernel_takes_it() -> None:
    op = ClassOp("eth0", handle(1, 0x101), handle(1), 25_000_000, 25_000_000, 16_384, 16_384, 60_000)
    message = change_message(TcStep("change", op), 7)
    length, kind, flags, seq, _ = NLMSGHDR.unpack_from(message)
    assert (length, kind, seq) == (len(message), RTM_NEWTCLASS, 0)
    assert flags & 0x400 == 0  # no NLM_F_CREATE: the class must exist
    assert struct.unpack_from("=i", message, 20)[0] == 7  # the interface index
    assert b"htb\0" in message
    assert burst_ticks(16_384, 25_000_000 // 8) == 16_384 * 10**9 // (3_125_000 * 64)
    assert split(with_seq(message, 9) + with_seq(message, 10)) == [with_seq(message, 9), with_seq(message, 10)]


def test_rates_above_32_bits_carry_the_64_bit_attribute() -> None:
    op = ClassOp("eth0", handle(1, 0x101), handle(1), 100_000_000_000, 100_000_000_000, 10**7, 10**7, 60_000)
    message = change_message(TcStep("change", op), 3)
    assert struct.pack("=Q", 100_000_000_000 // 8) in message


def test_only_changes_are_encoded() -> None:
    with pytest.raises(Exception, match="only changes"):
        change_message(TcStep("add", QdiscOp("eth0", handle(1, 1), handle(2), Pfifo(10))), 3)


def test_a_schedule_round_trips_and_its_agenda_counts_from_the_start() -> None:
    message = change_message(TcStep("change", QdiscOp("eth0", handle(1, 1), handle(2), Pfifo(10))), 3)
    schedule = Schedule({"node0": NamespaceRef("/proc/1/ns/net", 1, 2)},
                        (ScheduleEntry(1, 500, "a", (("node0", message),), ({"queue": 1},)),
                         ScheduleEntry(2, 1000, "b")))
    again = Schedule.from_json(schedule.to_json())
    assert again == schedule
    agenda = Agenda(again.entries, start_ns=10_000)
    assert agenda.next_due_ns() == 10_500
    assert [e.index for e in agenda.due(10_499)] == []
    assert [e.index for e in agenda.due(11_000)] == [1, 2]
    assert agenda.next_due_ns() is None


@pytest.mark.parametrize("bad", [
    '{"entries": [{"due_ns": 5}, {"due_ns": 1}]}',
    '{"namespaces": {}, "entries": [{"due_ns": 1, "sends": [["x", "00"]]}]}',
    '{"namespaces": {"x": ["/p", 1, 2]}, "entries": [{"due_ns": 1, "sends": [["x", "0102"]]}]}'])
def test_a_bad_schedule_is_refused_before_the_run(bad: str) -> None:
    with pytest.raises(Exception):  # noqa: B017  (ValueError or ShapingError, each naming the problem)
        Schedule.from_json(bad)


def test_a_recorded_timeline_replays_to_the_same_states() -> None:
    timeline = link_timeline(PROFILE, 3, 10.0)
    records = change_records(timeline, {i: (t.at_s + 0.001, ()) for i, t in enumerate(timeline)})
    assert records[1]["links"] == [{"links": ["0->1"], "settings": timeline[1].state.links[(0, 1)].to_dict()}]
    assert records[2]["links"] == [{"links": ["1->2"], "settings": "cut"}]
    assert records[1]["lateness_s"] == pytest.approx(0.001)
    states, actions = replayed({"changes": records, "churn": [{"at_s": 3.0, "kind": "kill", "nodes": [2]}]}, 3)
    assert [s.state for s in states] == [t.state for t in timeline]
    assert [s.at_s for s in states] == [t.at_s for t in timeline]
    assert [(a.at_s, a.kind, a.nodes) for a in actions] == [(3.0, "kill", (2,))]
