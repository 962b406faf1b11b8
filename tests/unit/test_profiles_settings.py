"""The settings table: it covers every LinkSpec field, and every backend applies or refuses each one.

"Applies" is checked against the table's own claim: planning a link with the setting and the same
link with the setting back at neutral must differ in the attributes the table names for that
backend (``Netem.delay_us``, ``LinkParams.loss``, ``ClassOp.ceil_bps``, ...). "Refuses" means
planning raises a ShapingError naming the setting's key and the backend. Nothing may be dropped.
"""

from __future__ import annotations

import dataclasses
from collections import defaultdict
from collections.abc import Callable, Mapping
from typing import Any

import pytest

from squall.calibration.runner import rate_only, unlimited
from squall.profiles import Chance, GilbertElliott, Jitter, LinkSpec, Loss, NodeLinkSpec
from squall.profiles.errors import Origin
from squall.profiles.links import parse_link_section
from squall.profiles.model import Distribution
from squall.profiles.settings import BY_FIELD, LINK_KEYS, SETTINGS, Carrier, calm, refusals
from squall.shaping.base import BACKENDS, Endpoint, LinkState, ShapingError
from squall.shaping.netem.leaf import Netem
from squall.shaping.netem.plan import NETEM_ATTRS, netem_qdisc, plan_netem
from squall.shaping.nfqueue import config as daemon_config
from squall.shaping.nfqueue.plan import DAEMON_PARAMS, link_params, plan_nfqueue
from squall.shaping.planning import ops

EPS = [Endpoint(i, f"10.9.0.{i + 2}", f"/proc/{100 + i}/ns/net") for i in range(2)]
PLAN_TYPES = {cls.__name__: cls for cls in (Netem, ops.Pfifo, ops.ClassOp, ops.RuleOp, daemon_config.LinkParams)}
PLANNERS: dict[str, Callable[[list[Endpoint], LinkState], Mapping[int, ops.NodePlan]]] = {
    "netem": plan_netem, "nfqueue": plan_nfqueue}
DELAY = 5000

# Links that set each field (with what it needs: reorder needs a delay, a limit sizes a queue that
# a delay or a rate creates). A field missing here fails test_every_field_has_examples.
EXAMPLES: dict[str, list[LinkSpec]] = {
    "delay_us": [LinkSpec(delay_us=DELAY)],
    "jitter": [LinkSpec(jitter=Jitter(1000)), LinkSpec(delay_us=DELAY, jitter=Jitter(1000, Distribution.NORMAL, 0.25))],
    "loss": [LinkSpec(loss=Loss(0.05)), LinkSpec(loss=Loss(0.05, 0.25)),
             LinkSpec(loss=Loss(gemodel=GilbertElliott(0.01, 0.2, 0.9, 0.01)))],
    "duplicate": [LinkSpec(duplicate=Chance(0.05)), LinkSpec(duplicate=Chance(0.05, 0.1))],
    "reorder": [LinkSpec(delay_us=DELAY, reorder=Chance(0.05)), LinkSpec(delay_us=DELAY, reorder=Chance(0.05, 0.5))],
    "rate_bps": [LinkSpec(rate_bps=10**6), LinkSpec(delay_us=DELAY, rate_bps=10**6)],
    "limit_packets": [LinkSpec(delay_us=DELAY, limit_packets=50), LinkSpec(rate_bps=10**6, limit_packets=50),
                      LinkSpec(delay_us=DELAY, rate_bps=10**6, limit_packets=50)],
}
CASES = [
    pytest.param(field, spec, backend, id=f"{backend}-{field}-{i}")
    for field, specs in EXAMPLES.items()
    for i, spec in enumerate(specs)
    for backend in BACKENDS
]


def _carried(value: object, found: dict[str, list[str]]) -> None:
    """Every attribute of every plan value, as "Type.attr" -> [repr of each value seen]."""
    if isinstance(value, tuple | list):
        for item in value:
            _carried(item, found)
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        for f in dataclasses.fields(value):
            attr = getattr(value, f.name)
            found[f"{type(value).__name__}.{f.name}"].append(repr(attr))
            _carried(attr, found)


def _plan_attrs(backend: str, spec: LinkSpec) -> dict[str, list[str]]:
    found: dict[str, list[str]] = defaultdict(list)
    _carried(list(PLANNERS[backend](EPS, LinkState({(0, 1): spec})).values()), found)
    return {key: sorted(values) for key, values in found.items()}


def test_the_table_covers_every_linkspec_field_once() -> None:
    fields = [f.name for f in dataclasses.fields(LinkSpec)]
    assert sorted(BY_FIELD) == sorted(fields), "add a row to squall/profiles/settings.py for each LinkSpec field"
    assert len(SETTINGS) == len(fields) and len(LINK_KEYS) == len(set(LINK_KEYS)) == len(fields)


def test_every_field_has_examples() -> None:
    assert sorted(EXAMPLES) == sorted(BY_FIELD)
    for field, specs in EXAMPLES.items():
        assert all(BY_FIELD[field].is_set(spec) for spec in specs), field


def test_the_named_attributes_exist_and_each_carrier_has_its_translator() -> None:
    for setting in SETTINGS:
        for backend in BACKENDS:
            treatment = setting.on(backend)
            assert treatment.attrs, (setting.field, backend)
            for attr in treatment.attrs:
                type_name, _, name = attr.partition(".")
                assert name in {f.name for f in dataclasses.fields(PLAN_TYPES[type_name])}, attr
    netem = {s.field for s in SETTINGS if s.netem.carrier is Carrier.NETEM}
    daemon = {s.field for s in SETTINGS if s.nfqueue.carrier is Carrier.DAEMON}
    assert set(NETEM_ATTRS) == netem and set(DAEMON_PARAMS) == daemon
    for field, translate in NETEM_ATTRS.items():
        assert {f"Netem.{k}" for k in translate(EXAMPLES[field][-1])} <= set(BY_FIELD[field].netem.attrs), field
    for field, translate in DAEMON_PARAMS.items():
        produced = {f"LinkParams.{k}" for k in translate(EXAMPLES[field][-1])}
        assert produced <= set(BY_FIELD[field].nfqueue.attrs), field


@pytest.mark.parametrize(("field", "spec", "backend"), CASES)
def test_each_backend_applies_or_refuses_each_field(field: str, spec: LinkSpec, backend: str) -> None:
    setting = BY_FIELD[field]
    treatment = setting.on(backend)
    refused = [r for r in treatment.refuses if r.when(spec)]
    if refused:
        with pytest.raises(ShapingError) as err:
            PLANNERS[backend](EPS, LinkState({(0, 1): spec}))
        assert setting.key in str(err.value) and f"{backend} backend" in str(err.value)
        assert refusals(spec, backend) == refused
        return
    neutral_value: dict[str, Any] = {field: setting.neutral}
    without = dataclasses.replace(spec, **neutral_value)
    with_it, neutral = _plan_attrs(backend, spec), _plan_attrs(backend, without)
    changed = [a for a in treatment.attrs if with_it.get(a) != neutral.get(a)]
    assert changed, f"{backend} drops {field}: none of {treatment.attrs} differs from the plan without it"


def test_a_limit_alone_sizes_nothing_on_either_backend() -> None:
    alone = LinkState({(0, 1): LinkSpec(limit_packets=50)})
    for backend in BACKENDS:
        assert all(plan.empty for plan in PLANNERS[backend](EPS, alone).values()), backend


def test_the_refusals_keep_their_messages() -> None:
    with pytest.raises(ShapingError, match=r"link 0 -> 1: limit without a rate is not supported by the nfqueue"):
        PLANNERS["nfqueue"](EPS, LinkState({(0, 1): LinkSpec(delay_us=DELAY, limit_packets=50)}))
    assert PLANNERS["netem"](EPS, LinkState({(0, 1): LinkSpec(delay_us=DELAY, duplicate=Chance(0.05, 0.1))}))


def test_profile_keys_come_from_the_table() -> None:
    raw = {s.key: v for s, v in zip(SETTINGS, ("5ms", "1ms", "1%", "2%", "3%", "10mbit", 100), strict=True)}
    patch = parse_link_section(Origin("t.yaml", "links.default"), raw)
    assert [field for field, _ in patch.items()] == [s.field for s in SETTINGS]
    values: dict[str, Any] = dict(patch.items())
    spec = dataclasses.replace(LinkSpec(), **values)
    assert spec == LinkSpec(5000, Jitter(1000), Loss(0.01), Chance(0.02), Chance(0.03), 10**7, 100)
    assert netem_qdisc(spec, spec.rate_bps).limit == 100 and link_params(spec).reorder == 0.03


FULL = LinkSpec(DELAY, Jitter(1000), Loss(0.01), Chance(0.02), Chance(0.03), 10**7, 100)


def test_calm_is_a_whitelist() -> None:
    assert calm(FULL) == LinkSpec(delay_us=DELAY, rate_bps=10**7, limit_packets=100)
    assert calm(FULL, drop=frozenset({"rate_bps", "limit_packets"})) == LinkSpec(delay_us=DELAY)
    with pytest.raises(ValueError, match=r"drop names \[.rate.\]"):
        calm(FULL, drop=frozenset({"rate"}))
    assert {s.field for s in SETTINGS if s.calm} == {"delay_us", "rate_bps", "limit_packets"}


def test_calibration_phases_keep_the_calm_settings_and_plan_on_both_backends() -> None:
    st = LinkState({(0, 1): FULL, (1, 0): LinkSpec(loss=Loss(0.05))}, {0: NodeLinkSpec(uplink_bps=10**8)},
                   frozenset({(1, 0)}))
    calm_state, free = rate_only(st), unlimited(st)
    assert calm_state.links == {(0, 1): calm(FULL), (1, 0): LinkSpec()} and calm_state.node_links == st.node_links
    assert free.links[(0, 1)] == LinkSpec(delay_us=DELAY) and free.node_links == {} and free.blocked == st.blocked
    for backend in BACKENDS:
        for state in (calm_state, free):
            PLANNERS[backend](EPS, state)


def test_every_row_names_its_unit_and_the_plans_carry_values_in_it() -> None:
    """One unit per setting: the netem leaf and the daemon's parameters hold the LinkSpec's own numbers."""
    assert all(s.unit for s in SETTINGS)
    ge = GilbertElliott(0.01, 0.2, 0.9, 0.01)
    spec = LinkSpec(DELAY, Jitter(1000, Distribution.NORMAL, 0.25), Loss(0.05, 0.125), Chance(0.02),
                    Chance(0.03, 0.5), 10**7, 100)
    leaf = netem_qdisc(spec, spec.rate_bps)
    assert (leaf.delay_us, leaf.jitter_us, leaf.delay_corr, leaf.loss, leaf.loss_corr, leaf.duplicate, leaf.reorder,
            leaf.reorder_corr, leaf.limit) == (DELAY, 1000, 0.25, 0.05, 0.125, 0.02, 0.03, 0.5, 100)
    params = link_params(spec)
    assert (params.delay_us, params.jitter_us, params.jitter_correlation, params.loss, params.loss_correlation,
            params.reorder, params.reorder_correlation) == (DELAY, 1000, 0.25, 0.05, 0.125, 0.03, 0.5)
    bursty = dataclasses.replace(spec, loss=Loss(gemodel=ge))
    daemon_ge = link_params(bursty).gilbert_elliott
    assert netem_qdisc(bursty, None).gemodel == ge
    assert daemon_ge is not None and (daemon_ge.p, daemon_ge.r, daemon_ge.loss_bad, daemon_ge.loss_good) == (
        ge.p, ge.r, ge.loss_bad, ge.loss_good)
