"""ClusterSpec validation, sizes, sysctls and addresses (pure; no Docker)."""

from __future__ import annotations

import ipaddress
import random

import pytest

from squall.cluster.errors import ClusterSpecError
from squall.cluster.spec import ClusterSpec, Mount, node_address, parse_bytes
from squall.cluster.subnets import overlapping, pick_free


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"workers": 0}, "workers must be an integer in 1..250"),
        ({"workers": -3}, "workers must be an integer in 1..250"),
        ({"workers": 251}, "workers must be an integer in 1..250"),
        ({"workers": True}, "workers must be an integer"),
        ({"workers": 2, "cpus": -1}, "cpus must be > 0"),
        ({"workers": 2, "cpus": 0}, "cpus must be > 0"),
        ({"workers": 2, "cpus": 10_000}, "exceeds this machine"),
        ({"workers": 2, "memory": "12m"}, "memory must be >= 64m"),
        ({"workers": 2, "memory": "lots"}, "is not a size"),
        ({"workers": 2, "subnet": "10.0.0.0/33"}, "is not an IPv4 network"),
        ({"workers": 2, "subnet": "10.0.0.1/24"}, "is not an IPv4 network"),
        ({"workers": 2, "subnet": "fd00::/64"}, "must be IPv4"),
        ({"workers": 10, "subnet": "10.9.9.0/29"}, "too small for 10 workers"),
        ({"workers": 2, "name": "Bad_Name"}, "name 'Bad_Name' must match"),
        ({"workers": 2, "tcp_buffer_max": 10}, "tcp_buffer_max must be >= 64 KiB"),
        ({"workers": 2, "mounts": (Mount("relative", "/x"),)}, "must be absolute"),
        ({"workers": 2, "mounts": (Mount("/nonexistent-dir-xyz", "/x"),)}, "is not a directory"),
    ],
)
def test_impossible_specs_are_rejected_with_a_reason(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ClusterSpecError, match=message):
        ClusterSpec(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    ("text", "expected"),
    [("512m", 512 << 20), ("1g", 1 << 30), ("1.5GiB", 3 << 29), ("64MB", 64 << 20), (4096, 4096), ("100k", 102400)],
)
def test_parse_bytes(text: str | int, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_sysctls_cover_the_bandwidth_delay_product_of_1gbit_at_100ms() -> None:
    spec = ClusterSpec(workers=2)
    bdp = 1e9 / 8 * 0.100
    for key in ("net.ipv4.tcp_rmem", "net.ipv4.tcp_wmem"):
        assert int(spec.sysctls()[key].split()[2]) >= bdp


def test_node_addresses_skip_the_gateway() -> None:
    net = ipaddress.IPv4Network("10.1.2.0/24")
    assert [node_address(net, i) for i in range(3)] == ["10.1.2.2", "10.1.2.3", "10.1.2.4"]


def test_pick_free_avoids_every_used_network() -> None:
    base = ipaddress.IPv4Network("10.50.0.0/22")  # four /24s
    used = [ipaddress.IPv4Network("10.50.0.0/24"), ipaddress.IPv4Network("10.50.2.0/23")]
    picks = {pick_free(used, rng=random.Random(seed), base=base) for seed in range(20)}
    assert picks == {ipaddress.IPv4Network("10.50.1.0/24")}
    assert overlapping(ipaddress.IPv4Network("10.50.2.128/25"), used) == used[1]


def test_pick_free_reports_an_exhausted_pool() -> None:
    base = ipaddress.IPv4Network("10.60.0.0/24")
    with pytest.raises(RuntimeError, match="no free /24 left"):
        pick_free([base], rng=random.Random(0), base=base)


def test_pick_free_spreads_concurrent_runs() -> None:
    picks = {pick_free([], rng=random.Random(seed)) for seed in range(50)}
    assert len(picks) > 40  # two runs starting together rarely pick the same subnet
