"""Which guest test of the netem VM stands for which netem test of the host's suites, and when it does.

On a kernel without ``sch_netem`` the host's ``[netem]`` tests (``test_shaping_backends``,
``test_shaping_conformance``) cannot run; the netem VM (``tests/integration/test_netem_vm.py``)
runs each of them on a real netem kernel instead. So that a ``make test`` on such a host shows the
VM's verdicts rather than a column of skips, :func:`stand_ins` names the host rows the VM's rows
stand for in this session, and ``tests/conftest.py`` deselects exactly those. Nothing is hidden:

* a host WITH netem runs its ``[netem]`` rows natively (nothing is deselected);
* a host row is deselected only when the VM's row for it (:func:`guest_row`, :func:`vm_item`) is
  selected in the same session and the VM is not switched off (``SQUALL_NETEM_VM=0``, refused
  under ``CI=true``: :func:`vm_switched_off`); a host row without one stays, and skips with its reason;
* ``test_netem_vm.py::test_every_host_netem_test_has_a_guest_row`` collects the host's suites and
  fails if any ``[netem]`` row of theirs has no guest row.
"""

from __future__ import annotations

import os

from squall.cluster.engine import in_ci

VM_TEST_FILE = "tests/integration/test_netem_vm.py"
BACKENDS = "tests/integration/test_shaping_backends.py::"
CONFORMANCE = "tests/integration/test_shaping_conformance.py::"
#: The host files whose netem rows the VM stands for (test_calibration has no netem parametrization:
#: it calibrates with the default backend; the guest's test_calibration_on_netem rows calibrate netem).
TRACES = "tests/integration/test_shaping_trace_changes.py::"
HOST_FILES = ("tests/integration/test_shaping_backends.py", "tests/integration/test_shaping_conformance.py",
              "tests/integration/test_shaping_trace_changes.py")
#: Host tests the guest runs in a restated form (tests/netem_vm/guest_backends.py says why).
RESTATED = {
    BACKENDS + "test_delay_of_a_link[netem]": "tests/netem_vm/guest_backends.py::test_delay_of_a_link_netem",
    BACKENDS + "test_change_takes_effect_within_100ms[netem]":
        "tests/netem_vm/guest_backends.py::test_change_takes_effect_within_100ms_netem",
    BACKENDS + "test_clear_restores_namespaces_exactly[netem]":
        "tests/netem_vm/guest_backends.py::test_clear_restores_namespaces_exactly_netem",
    BACKENDS + "test_replace_endpoint_after_a_restart[netem]":
        "tests/netem_vm/guest_backends.py::test_replace_endpoint_after_a_restart_netem",
    BACKENDS + "test_duplication[netem]": "tests/netem_vm/guest_backends.py::test_duplication_netem",
    CONFORMANCE + "test_rate[netem-100mbit]": "tests/netem_vm/guest_conformance.py::test_rate[netem-20mbit]",
    CONFORMANCE + "test_rate[netem-1gbit]": "tests/netem_vm/guest_conformance.py::test_rate[netem-40mbit]",
    TRACES + "test_a_tcp_stream_survives_50_changes_in_place[netem]":
        "tests/netem_vm/guest_conformance.py::test_a_tcp_stream_survives_50_changes_in_place[netem]",
}
SWITCH = "SQUALL_NETEM_VM"
_G = "tests/netem_vm/guest_conformance.py::"
#: Every test the guest runs (scripts/netem-vm/guest.sh). A guest row missing here, or one listed here
#: that did not run, fails test_netem_vm.py::test_the_guest_ran_exactly_the_listed_tests.
GUEST_TESTS = (
    BACKENDS + "test_a_pair_setting_changes_only_that_pair[netem]",
    BACKENDS + "test_blocked_pair_drops_everything_and_unblocking_restores[netem]",
    BACKENDS + "test_rate_limit_tcp_goodput[netem]",
    BACKENDS + "test_incremental_changes_match_a_fresh_apply[netem]",
    BACKENDS + "test_counters_count_what_each_directed_link_carried[netem]",
    *RESTATED.values(),
    _G + "test_a_partition_blocks_and_a_heal_restores[netem]",
    _G + "test_a_per_pair_setting_changes_only_that_pair[netem]",
    _G + "test_a_phase_takes_effect_within_100_ms[netem]",
    _G + "test_delay_mean[netem-1ms]",
    _G + "test_delay_mean[netem-20ms]",
    _G + "test_delay_mean[netem-100ms]",
    _G + "test_jitter_sd[netem-uniform-5ms]",
    _G + "test_jitter_sd[netem-normal-2ms]",
    _G + "test_links_without_settings_stay_untouched[netem]",
    _G + "test_loss_inside_the_99_percent_binomial_region[netem-1pct]",
    _G + "test_loss_inside_the_99_percent_binomial_region[netem-10pct]",
    _G + "test_rate[netem-10mbit]",
    _G + "test_ping_rtt_is_the_sum_of_both_directions[netem-20+20ms]",
    _G + "test_ping_rtt_is_the_sum_of_both_directions[netem-50+10ms]",
    _G + "test_iperf3_gets_the_link_rate[netem-tcp]",
    _G + "test_iperf3_gets_the_link_rate[netem-udp]",
    _G + "test_calibration_on_netem[netem-wan-5ms]",
    _G + "test_calibration_on_netem[netem-lossy-1pct]",
    _G + "test_calibration_on_netem[netem-thin-20mbit]",
)


def is_netem_row(nodeid: str) -> bool:
    """Whether ``nodeid`` is a netem-backend row of one of :data:`HOST_FILES`."""
    path, _, rest = nodeid.partition("::")
    return path in HOST_FILES and ("[netem]" in rest or "[netem-" in rest)


def guest_row(nodeid: str) -> str:
    """The id of the guest test that runs the host's netem row ``nodeid`` (the conformance suite's tests
    keep their names in ``tests/netem_vm/guest_conformance.py``; two backend tests are restated)."""
    if nodeid in RESTATED:
        return RESTATED[nodeid]
    if nodeid.startswith(CONFORMANCE):
        return _G + nodeid[len(CONFORMANCE):]
    return nodeid  # test_shaping_backends' rows run unchanged in the guest


def vm_switched_off() -> bool:
    """Whether this session switched the VM off: ``SQUALL_NETEM_VM=0`` (a laptop that cannot spare the
    6-9 minutes), never under ``CI=true``, where the switch is refused (:func:`switch_refused`): CI
    runs the VM. The VM is part of ``make test`` since two consecutive full runs passed on this 2-core
    host beside a CPU-bound process (README, testing section). Switched off, the host's own
    ``[netem]`` rows run (or skip, with their reason, on a kernel without netem).
    """
    return os.environ.get(SWITCH) == "0" and not in_ci()


def switch_refused() -> bool:
    """``SQUALL_NETEM_VM=0`` under ``CI=true``: refused (the VM's tests fail saying so), never a quiet skip."""
    return os.environ.get(SWITCH) == "0" and in_ci()


def vm_item(guest_test: str) -> str:
    """The node id of ``test_netem_vm.py``'s test that reports the guest's ``guest_test``."""
    return f"{VM_TEST_FILE}::test_in_the_netem_vm[{guest_test.split('::')[1]}]"


def stand_ins(nodeids: list[str], *, netem_here: bool) -> list[str]:
    """The host netem rows among ``nodeids`` that the VM's rows stand for in this session: each one's
    ``test_in_the_netem_vm`` row is selected too, this kernel has no netem, the VM is not switched off."""
    if netem_here or vm_switched_off():
        return []
    selected = set(nodeids)
    return [n for n in nodeids if is_netem_row(n) and guest_row(n) in GUEST_TESTS
            and vm_item(guest_row(n)) in selected]
