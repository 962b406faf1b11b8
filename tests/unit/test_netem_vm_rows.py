"""Which host [netem] rows the netem VM's rows stand for (tests/netem_vm/rows.py): pure rules, no VM."""

from __future__ import annotations

import pytest

from tests.netem_vm.rows import (
    GUEST_TESTS,
    RESTATED,
    guest_row,
    is_netem_row,
    stand_ins,
    switch_refused,
    vm_item,
    vm_switched_off,
)

B = "tests/integration/test_shaping_backends.py::"
C = "tests/integration/test_shaping_conformance.py::"
HOST = [B + "test_duplication[netem]", B + "test_duplication[nfqueue]", C + "test_delay_mean[netem-1ms]",
        C + "test_delay_mean[nfqueue-1ms]", B + "test_delay_of_a_link[netem]"]
VM = [vm_item(guest_row(n)) for n in HOST if is_netem_row(n)]


@pytest.fixture(autouse=True)
def _vm_on(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("SQUALL_NETEM_VM", raising=False)
    monkeypatch.delenv("CI", raising=False)


def test_netem_rows_are_told_from_others() -> None:
    assert [n for n in HOST if is_netem_row(n)] == [HOST[0], HOST[2], HOST[4]]
    assert not is_netem_row("tests/integration/test_calibration.py::test_x[netem]")  # not a file the VM covers


def test_guest_rows_keep_names_or_are_restated() -> None:
    assert guest_row(B + "test_a_pair_setting_changes_only_that_pair[netem]") == (
        B + "test_a_pair_setting_changes_only_that_pair[netem]")
    guest = "tests/netem_vm/guest_conformance.py::"
    assert guest_row(C + "test_delay_mean[netem-1ms]") == guest + "test_delay_mean[netem-1ms]"
    assert guest_row(B + "test_delay_of_a_link[netem]") == RESTATED[B + "test_delay_of_a_link[netem]"]
    assert all(g in GUEST_TESTS for g in RESTATED.values())
    assert len(set(GUEST_TESTS)) == len(GUEST_TESTS), "a guest test listed twice"
    name = GUEST_TESTS[0].split("::")[1]
    assert vm_item(GUEST_TESTS[0]) == f"tests/integration/test_netem_vm.py::test_in_the_netem_vm[{name}]"


def test_the_vm_stands_in_only_on_a_kernel_without_netem_and_only_where_its_row_runs(
        monkeypatch: pytest.MonkeyPatch) -> None:
    assert stand_ins(HOST + VM, netem_here=False) == [HOST[0], HOST[2], HOST[4]]
    assert stand_ins(HOST + VM, netem_here=True) == []  # a netem host runs them natively
    assert stand_ins(HOST, netem_here=False) == []  # the VM's rows are not selected: nothing stands in
    assert stand_ins(HOST + VM[:1], netem_here=False) == [HOST[0]]  # only the row whose VM row runs


def test_the_vm_runs_unless_switched_off_and_never_off_under_ci(monkeypatch: pytest.MonkeyPatch) -> None:
    everywhere = [HOST[0], HOST[2], HOST[4]]
    for value in (None, "1", "yes"):  # on by default (make test): only "0" switches it off
        if value is None:
            monkeypatch.delenv("SQUALL_NETEM_VM", raising=False)
        else:
            monkeypatch.setenv("SQUALL_NETEM_VM", value)
        assert not vm_switched_off() and not switch_refused()
        assert stand_ins(HOST + VM, netem_here=False) == everywhere
    monkeypatch.setenv("SQUALL_NETEM_VM", "0")
    assert vm_switched_off() and not switch_refused()
    assert stand_ins(HOST + VM, netem_here=False) == []  # off: nothing deselected, the host rows run (or skip)
    monkeypatch.setenv("CI", "true")  # under CI the switch is refused: the VM's rows run (and fail saying so)
    assert not vm_switched_off() and switch_refused()
    assert stand_ins(HOST + VM, netem_here=False) == everywhere
