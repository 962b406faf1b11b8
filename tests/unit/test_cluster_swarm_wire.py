"""The swarm engine's pure parts: the LinkState codec, the token check, the overlay's size, cgroup check."""

from __future__ import annotations

import socket
import threading
from pathlib import Path

import pytest

from squall.cluster.swarm import wire
from squall.cluster.swarm.cluster import subnet_prefix
from squall.cluster.swarm.node_agent import Agent, Config, cgroup_names
from squall.profiles import LinkSpec, NodeLinkSpec, load_profile
from squall.profiles.model import Chance, Distribution, GilbertElliott, Jitter, Loss
from squall.shaping import state_at
from squall.shaping.base import Endpoint, LinkState, ShapingError


def test_every_setting_of_a_link_survives_the_round_trip() -> None:
    spec = LinkSpec(delay_us=5000, jitter=Jitter(300, Distribution.PARETO, 0.25),
                    loss=Loss(gemodel=GilbertElliott(0.01, 0.3, 0.9, 0.005)), duplicate=Chance(0.005, 0.1),
                    reorder=Chance(0.02), rate_bps=20_000_000, limit_packets=500)
    state = LinkState({(0, 1): spec, (1, 0): LinkSpec()}, {1: NodeLinkSpec(10_000_000, None)},
                      frozenset({(2, 0)}))
    back = wire.state_from_json(wire.state_to_json(state))
    assert back == state
    assert wire.decode_state(wire.encode_state(state)) == state
    with pytest.raises(wire.WireError, match="string"):
        wire.decode_state(wire.state_to_json(state))
    with pytest.raises(wire.WireError, match="not JSON"):
        wire.decode_state("{")


@pytest.mark.parametrize("profile", ["wan-5ms", "lossy-1pct", "lan"])
def test_shipped_profiles_survive_the_round_trip(profile: str) -> None:
    state = state_at(load_profile(profile), 6, 0.0)
    assert wire.state_from_json(wire.state_to_json(state)) == state


def test_unknown_keys_and_wrong_types_are_refused() -> None:
    good = wire.state_to_json(LinkState({(0, 1): LinkSpec(delay_us=1000)}))
    bad_key = {**good, "specs": [{"delay_us": 1000, "evil": 1}]}
    with pytest.raises(wire.WireError, match="evil"):
        wire.state_from_json(bad_key)
    with pytest.raises(wire.WireError, match="integer"):
        wire.state_from_json({**good, "blocked": [["0", 1]]})
    with pytest.raises(wire.WireError, match="list index"):
        wire.state_from_json({**good, "links": [[0, 1, 5]]})  # a setting that is not in the table
    with pytest.raises(wire.WireError, match="exactly"):
        wire.state_from_json({**good, "extra": []})
    with pytest.raises(wire.WireError):
        wire.endpoint_from_json({"index": 0, "address": "10.0.0.2", "netns": 5, "device": "eth0"})
    ep = Endpoint(3, "10.213.0.5", "/proc/1/ns/net")
    assert wire.endpoint_from_json(wire.endpoint_to_json(ep)) == ep


def test_token_check() -> None:
    token = "ab" * 32
    assert wire.token_ok(token, token)
    assert not wire.token_ok("ab" * 31, token)
    assert not wire.token_ok(None, token)
    assert not wire.token_ok(12, token)


def test_lines_are_bounded_and_json_only() -> None:
    a, b = socket.socketpair()
    with a, b:
        threading.Thread(target=lambda: a.sendall(b"x" * 200), daemon=True).start()
        with pytest.raises(wire.WireError, match="longer than the limit of 100"):
            wire.read_line(b, limit=100)
    a, b = socket.socketpair()
    with a, b:
        a.sendall(b"[1, 2]\n")
        with pytest.raises(wire.WireError, match="object"):
            wire.read_line(b)
    a, b = socket.socketpair()
    with a, b:
        wire.write_line(a, {"cmd": "hello", "n": 1})
        assert wire.read_line(b) == {"cmd": "hello", "n": 1}


@pytest.mark.parametrize(("workers", "prefix"), [(1, 24), (4, 24), (250, 24), (253, 24), (254, 23), (256, 23),
                                                 (509, 23), (510, 22), (1000, 22)])
def test_the_overlay_holds_the_workers(workers: int, prefix: int) -> None:
    assert subnet_prefix(workers) == prefix
    assert 2 ** (32 - prefix) - 3 >= workers  # network, the overlay's gateway, broadcast


def test_cgroup_check_needs_the_container_id(tmp_path: Path) -> None:
    cid = "9df76ef7199953851429f8d0399a64d8f0726a6ccaf70f3ac5d9a83840a11894"
    (tmp_path / "42").mkdir()
    (tmp_path / "42" / "cgroup").write_text(f"9:name=systemd:/docker/{cid}\n8:pids:/docker/{cid}\n")
    assert cgroup_names(42, cid, proc=str(tmp_path))
    assert not cgroup_names(42, "c4e94683077f" + "0" * 52, proc=str(tmp_path))
    assert not cgroup_names(43, cid, proc=str(tmp_path))  # no such process
    assert not cgroup_names(42, "", proc=str(tmp_path))  # an empty id matches nothing


def test_a_256_worker_state_is_small_on_the_wire() -> None:
    import json

    state = state_at(load_profile("wan-5ms"), 256, 0.0)
    encoded = json.dumps(wire.state_to_json(state), separators=(",", ":")).encode()
    assert len(state.links) == 256 * 255
    assert len(encoded) < wire.MAX_LINE // 8, len(encoded)
    assert wire.state_from_json(json.loads(encoded)) == state


def _node_agent(tmp_path: Path) -> Agent:
    """A node agent as the service starts one, without a Docker engine (the commands below need none)."""
    config = Config("r1", 7000, "t" * 32, "svc", "net", tmp_path, 2, (0, 0))
    return Agent(config, docker=None)


def test_every_node_command_has_one_handler_and_an_unknown_one_is_refused(tmp_path: Path) -> None:
    agent = _node_agent(tmp_path)
    try:
        assert set(agent.handlers) == set(wire.NodeCommand)
        hello = agent.handle({"cmd": "hello"})
        assert hello["ok"] and hello["run"] == "r1" and hello["node"] == socket.gethostname()
        refused = agent.handle({"cmd": "shape_explode"})
        assert refused == {"ok": False, "error": "unknown command 'shape_explode'; known: "
                           + ", ".join(c.value for c in wire.NodeCommand)}
        assert not agent.handle({"no": "cmd"})["ok"]
        with pytest.raises(ShapingError, match="no shaper is open"):  # dispatched to its handler
            agent.handle({"cmd": "shape_check"})
    finally:
        agent.close()
