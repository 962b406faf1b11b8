"""Configuration dataclasses: validation reasons and the JSON round trip."""

from __future__ import annotations

import json
from typing import Any

import pytest

from squall.shaping.nfqueue.config import (
    DaemonConfig,
    GilbertElliott,
    LinkParams,
    NamespaceSpec,
    QueueSpec,
    config_from_dict,
    config_from_json,
    config_to_json,
    link_from_dict,
    to_jsonable,
)
from squall.shaping.nfqueue.errors import ConfigError
from tests.unit.shaping_pins import NAMES, written


def _config() -> DaemonConfig:
    link = LinkParams(
        delay_us=20_000,
        jitter_us=5_000,
        distribution="normal",
        jitter_correlation=0.25,
        gilbert_elliott=GilbertElliott(p=0.01, r=0.3, loss_bad=0.9),
    )
    return DaemonConfig(
        control_socket="/run/squall/nfq.sock",
        namespaces=(
            NamespaceSpec.for_pid("w1", 4242, [QueueSpec(1, link, seed=7, source="172.20.0.3")]),
            NamespaceSpec.for_named(
                "w2", "squall-test-x", [QueueSpec(2), QueueSpec(3, LinkParams(loss=0.1))]
            ),
        ),
        queue_maxlen=5_000,
    )


def test_json_round_trip() -> None:
    config = _config()
    assert config_from_json(config_to_json(config)) == config
    assert config.namespaces[0].netns == "/proc/4242/ns/net"
    assert config.namespaces[1].netns == "/run/netns/squall-test-x"


def test_missing_keys_take_defaults() -> None:
    config = config_from_dict(
        {
            "control_socket": "/tmp/x.sock",
            "namespaces": [{"name": "a", "netns": "/proc/1/ns/net", "queues": [{"queue": 0}]}],
        }
    )
    assert config.namespaces[0].queues[0].link == LinkParams()
    assert LinkParams().is_constant


@pytest.mark.parametrize(
    ("link", "why"),
    [
        ({"delay_us": -1}, "delay_us"),
        ({"delay_us": 1.5}, "delay_us"),
        ({"delay_us": True}, "delay_us"),
        ({"jitter_us": 10, "distribution": "gamma"}, "distribution"),
        ({"loss": 1.5}, "loss"),
        ({"loss_correlation": 0.5}, "loss_correlation requires loss"),
        ({"jitter_correlation": 0.5}, "jitter_correlation requires jitter"),
        ({"jitter_us": 5, "jitter_correlation": 1.0}, "jitter_correlation must be in [0, 1)"),
        ({"reorder": 0.1}, "reorder requires delay_us"),
        ({"delay_us": 5, "reorder_correlation": 0.1}, "reorder_correlation requires reorder"),
        ({"loss": 0.1, "gilbert_elliott": {"p": 0.1, "r": 0.5}}, "give one"),
        ({"gilbert_elliott": {"p": 0.0, "r": 0.0}}, "p + r > 0"),
        ({"gilbert_elliott": {"p": 0.1}}, "missing keys ['r']"),
        ({"gilbert_elliott": {"p": 0.1, "r": 0.2, "h": 0.1}}, "unknown keys ['h']"),
        ({"delay": 20}, "unknown keys ['delay']"),
        ({"loss": float("nan")}, "finite"),
        ([], "must be a JSON object"),
    ],
)
def test_bad_links_are_rejected_with_the_reason(link: Any, why: str) -> None:
    with pytest.raises(ConfigError) as err:
        link_from_dict(link)
    assert why in str(err.value)


@pytest.mark.parametrize(
    ("mutate", "why"),
    [
        (lambda c: c.update(control_socket=""), "control_socket"),
        (lambda c: c.update(queue_maxlen=0), "queue_maxlen"),
        (lambda c: c.update(rcvbuf_bytes=10), "rcvbuf_bytes"),
        (lambda c: c.update(extra=1), "unknown keys ['extra']"),
        (lambda c: c["namespaces"].append(dict(c["namespaces"][0])), "unique"),
        (lambda c: c["namespaces"][0].update(netns="relative/path"), "absolute"),
        (lambda c: c["namespaces"][0]["queues"].append({"queue": 1}), "twice"),
        (lambda c: c["namespaces"][0]["queues"][0].update(queue=70_000), "queue must be"),
        (lambda c: c["namespaces"][0]["queues"][0].update(seed="x"), "seed"),
    ],
)
def test_bad_configs_are_rejected_with_the_reason(mutate: Any, why: str) -> None:
    data = json.loads(config_to_json(_config()))
    mutate(data)
    with pytest.raises(ConfigError) as err:
        config_from_dict(data)
    assert why in str(err.value)


def test_invalid_json_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="not valid JSON"):
        config_from_json("{nope")


def test_gilbert_elliott_derived_rates() -> None:
    ge = GilbertElliott(p=0.1, r=0.4, loss_bad=0.5, loss_good=0.1)
    assert ge.bad_fraction == pytest.approx(0.2)
    assert ge.loss_rate == pytest.approx(0.2 * 0.5 + 0.8 * 0.1)
    assert not LinkParams(gilbert_elliott=ge).is_constant


# The daemon's JSON for link 0 -> 1 of each pinned profile (tests/unit/shaping_pins.py)
_PERFECT = {"delay_us": 0, "distribution": "uniform", "gilbert_elliott": None, "jitter_correlation": 0.0,
            "jitter_us": 0, "loss": 0.0, "loss_correlation": 0.0, "preserve_order": False, "reorder": 0.0,
            "reorder_correlation": 0.0}
PINNED_JSON: dict[str, dict[str, object]] = {
    "lan": {"delay_us": 100, "distribution": "normal", "jitter_us": 20},
    "lossy-1pct": {"delay_us": 5000, "loss": 0.01},
    "bursty-loss": {"delay_us": 10000, "gilbert_elliott": {"loss_bad": 1.0, "loss_good": 0.0, "p": 0.005, "r": 0.2}},
    "wan-50ms-100mbit": {"delay_us": 50000, "distribution": "normal", "jitter_correlation": 0.25, "jitter_us": 2000},
    "odd-percentages": {"delay_us": 7000, "distribution": "normal", "jitter_correlation": 0.125, "jitter_us": 1300,
                        "loss": 0.003, "loss_correlation": 0.33299999999999996, "reorder": 0.028999999999999998,
                        "reorder_correlation": 0.41700000000000004},
    "gemodel-ties": {"delay_us": 2000, "gilbert_elliott": {"loss_bad": 0.9, "loss_good": 0.001, "p": 0.01, "r": 0.1}},
    "gemodel-70": {"delay_us": 1000, "distribution": "pareto", "jitter_us": 300,
                   "gilbert_elliott": {"loss_bad": 0.7, "loss_good": 0.1, "p": 0.3, "r": 0.5}},
}


@pytest.mark.parametrize("name", NAMES)
def test_profiles_give_the_pinned_daemon_json(name: str) -> None:
    text = json.dumps(to_jsonable(written(name).daemon), sort_keys=True)
    assert text == json.dumps({**_PERFECT, **PINNED_JSON[name]}, sort_keys=True)  # the same floats, digit for digit
    assert link_from_dict(json.loads(text)) == written(name).daemon
