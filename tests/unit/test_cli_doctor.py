"""``squall doctor`` (squall/cli/doctor.py) and the kernel feature probe (squall/shaping/capabilities/features.py).

The verdict is pure and tested on written facts. The probe runs for real on this kernel and must
leave nothing: the host's links, iptables rules and named namespaces are the same before and after.
The CLI runs against the real engine and image (present here and in CI) and against a socket where
no engine answers (exit 3 with the fix).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from squall.cli.doctor import (
    LOCAL,
    NO_ENGINE,
    REFUSED,
    SWARM,
    EngineFacts,
    Facts,
    assess,
    render,
    to_json,
)
from squall.shaping.capabilities.features import USES, Feature, kernel_features
from squall.shaping.select import netem_probe

REPO = Path(__file__).resolve().parents[2]


def feature(name: str, available: bool = True) -> Feature:
    return Feature(name, available, "created", "written by the test", USES[name])


def facts(*, engine: EngineFacts | None = None, netem: bool = False, missing: tuple[str, ...] = (),
          image: str | None = "squall-worker:abc", root: bool = True) -> Facts:
    return Facts(
        engine=engine or EngineFacts(True, "unix:///var/run/docker.sock", version="27.0", local=True),
        netem_available=netem, netem_reason="probed", features=tuple(feature(n, n not in missing) for n in USES),
        image=image, cpus=2, load=(1.0, 0.5, 0.2), kernel="6.1.0", root=root)


def test_a_local_engine_with_image_and_kernel_is_ready() -> None:
    verdict = assess(facts())
    assert verdict.ready and verdict.engine == LOCAL and verdict.backend == "nfqueue"
    assert "ready: a run can start here" in render(facts(), verdict)


def test_netem_is_chosen_where_the_kernel_has_it() -> None:
    verdict = assess(facts(netem=True))
    assert verdict.backend == "netem" and verdict.ready


def test_no_engine_is_not_ready_with_the_fix() -> None:
    verdict = assess(facts(engine=EngineFacts(False, "unix:///nowhere.sock", error="refused"), image=None))
    assert verdict.engine == NO_ENGINE and not verdict.ready
    assert [p.fix for p in verdict.problems] == [
        "run 'scripts/ensure-docker.sh' (or 'make docker') to install or start one"]


def test_a_remote_engine_is_refused_unless_it_is_a_swarm_manager() -> None:
    remote = EngineFacts(True, "tcp://10.1.2.3:2376", local=False)
    refused = assess(facts(engine=remote))
    assert refused.engine == REFUSED and not refused.ready
    assert "--engine swarm" in refused.problems[0].fix
    manager = assess(facts(engine=EngineFacts(True, "tcp://10.1.2.3:2376", local=False, swarm="manager")))
    assert manager.engine == SWARM and manager.ready
    assert "--engine swarm" in manager.engine_why
    assert "each node's agent probes its own" in manager.backend_why


def test_missing_image_root_or_backend_feature_each_say_what_to_do() -> None:
    verdict = assess(facts(image=None, root=True, missing=("nfqueue", "vxlan")))
    whats = [p.what for p in verdict.problems]
    assert len(whats) == 2, whats
    assert "worker image" in whats[0]
    assert "the nfqueue backend needs nfqueue" in whats[1] and "vxlan" not in whats[1]  # vxlan: not the backend's
    # unprivileged, every probe fails for that reason: the capabilities are the one problem, not the features
    whats = [p.what for p in assess(facts(root=False, missing=("nfqueue",))).problems]
    assert len(whats) == 1 and "CAP_NET_ADMIN and CAP_SYS_ADMIN" in whats[0], whats
    # the netem backend needs sch_netem, and is only chosen when the probe found it
    assert assess(facts(netem=True, missing=("u32",))).problems[0].what.startswith("the netem backend needs u32")


def test_json_is_plain_data() -> None:
    data = json.loads(json.dumps(to_json(facts(), assess(facts()))))
    assert data["ready"] is True and data["facts"]["engine"]["version"] == "27.0"
    assert [f["name"] for f in data["facts"]["features"]] == list(USES)


# -- the real kernel ----------------------------------------------------------------------------


#: What the probe makes in its scratch namespace, by name and rule text: none of it may reach the host.
#: (Other runs on this machine add and remove links and rules meanwhile, so only these are compared.)
PROBE_RULES = ("-m statistic --mode random --probability 0.5 -j ACCEPT", "--queue-num 7 --queue-bypass")


def leaked() -> list[str]:
    """Links named like the probe's, and rules like the probe's, in the host's namespace."""
    def out(argv: list[str]) -> str:
        return subprocess.run(argv, capture_output=True, text=True, timeout=60, check=False).stdout

    links = [line.split(":")[1].strip() for line in out(["ip", "-o", "link"]).splitlines()]
    rules = out(["iptables-save"]).splitlines()
    return ([f"link {name}" for name in links if name.startswith("sqfeat")]
            + [f"rule {r}" for r in rules if any(p in r for p in PROBE_RULES)])


@pytest.mark.skipif(os.geteuid() != 0, reason="creating namespaces and links needs root")
def test_kernel_features_are_probed_and_leave_nothing() -> None:
    assert leaked() == []
    found = kernel_features()
    assert [f.name for f in found] == list(USES)
    by_name = {f.name: f for f in found}
    assert by_name["sch_netem"].available == netem_probe().available
    # Squall's containers need veth and both backends need htb: a host that runs Docker networks has them
    assert by_name["veth"].available, by_name["veth"].detail
    assert by_name["htb"].available, by_name["htb"].detail
    assert all(f.detail and f.how in ("created", "read", "created+read") for f in found)
    assert leaked() == []


@pytest.mark.skipif(os.geteuid() != 0, reason="creating links needs root")
def test_a_probe_leak_would_show() -> None:
    """leaked() sees a probe-named link made in the host namespace (so the check above can fail)."""
    subprocess.run(["ip", "link", "add", "sqfeatleak0", "type", "veth", "peer", "name", "sqfeatleak1"], check=True)
    try:
        assert "link sqfeatleak0@sqfeatleak1" in leaked()
    finally:
        subprocess.run(["ip", "link", "del", "sqfeatleak0"], check=False)
    assert leaked() == []


# -- the command --------------------------------------------------------------------------------


def doctor(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "squall.cli.main", "doctor", *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300, check=False)


def test_cli_says_ready_on_this_machine(docker_client: Any, worker_image: str) -> None:
    env = {k: v for k, v in os.environ.items() if k != "DOCKER_HOST"}
    done = doctor(env, "--json")
    data = json.loads(done.stdout)
    assert data["ready"] is (done.returncode == 0), done.stderr
    if os.geteuid() == 0:
        assert done.returncode == 0, data["problems"]
    assert data["engine"] == LOCAL
    assert data["facts"]["engine"]["local"] is True
    assert data["facts"]["image"] == worker_image
    assert data["facts"]["engine"]["version"] == docker_client.version()["Version"]
    table = doctor(env)
    assert "engine for a run" in table.stdout and "kernel: vxlan" in table.stdout


def test_cli_without_an_engine_exits_3_with_what_to_do(tmp_path: Path) -> None:
    env = {**os.environ, "DOCKER_HOST": f"unix://{tmp_path}/no-engine.sock"}
    done = doctor(env)
    assert done.returncode == 3, done.stdout + done.stderr
    assert "not ready:" in done.stdout and "scripts/ensure-docker.sh" in done.stdout
