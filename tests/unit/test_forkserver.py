"""The fork server's parts that need no container: reading a process's credentials and cgroups, finding
a cgroup's directory, checking a fork request, and the stand-in's two ways (watch a forked agent, or
become the agent). The forks themselves are tested on real containers (tests/integration/test_cluster.py)."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from squall.cluster.forkserve import forked_agent_argv, standin_command
from squall.worker import become
from squall.worker.forkserver import RequestError, parse_fork

STATUS = """Name:\tpython3
Umask:\t0022
State:\tS (sleeping)
Uid:\t0\t0\t0\t0
Gid:\t0\t0\t0\t0
Groups:\t0 1 2
NoNewPrivs:\t0
CapInh:\t0000000000000000
CapPrm:\t00000000a80425fb
CapEff:\t00000000a80425fb
CapBnd:\t00000000a80425fb
CapAmb:\t0000000000000000
"""


def test_status_keeps_the_credential_lines_in_one_order() -> None:
    status = become.parse_status(STATUS)
    assert [k for k, _ in status] == ["Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb",
                                      "NoNewPrivs"]
    target = become.Target(1, (), status)
    assert target.uid == 0 and target.gid == 0 and target.groups == [0, 1, 2]
    assert target.caps("CapEff") == 0xA80425FB and target.caps("CapAmb") == 0


def test_a_status_without_capability_lines_is_refused() -> None:
    with pytest.raises(become.BecomeError, match="lacks CapBnd"):
        become.parse_status(STATUS.replace("CapBnd:\t00000000a80425fb\n", ""))


def test_cgroup_lines_of_both_versions() -> None:
    text = "12:cpu,cpuacct:/docker/abc\n1:name=systemd:/docker/abc\n0::/docker/abc\n"
    assert become.parse_cgroups(text) == (("cpu,cpuacct", "/docker/abc"), ("name=systemd", "/docker/abc"),
                                          ("", "/docker/abc"))
    with pytest.raises(become.BecomeError, match="unexpected"):
        become.parse_cgroups("garbage\n")


def test_cgroup_directories_under_a_v1_and_a_v2_mount(tmp_path: Path) -> None:
    v1 = tmp_path / "v1"
    for d in ("cpu,cpuacct", "memory", "systemd", "unified"):
        (v1 / d).mkdir(parents=True)
    assert become.cgroup_dir(v1, "cpu,cpuacct", "/docker/x") == v1 / "cpu,cpuacct" / "docker/x"
    assert become.cgroup_dir(v1, "memory", "/docker/x") == v1 / "memory" / "docker/x"
    assert become.cgroup_dir(v1, "name=systemd", "/docker/x") == v1 / "systemd" / "docker/x"
    assert become.cgroup_dir(v1, "", "/docker/x") == v1 / "unified" / "docker/x"
    assert become.cgroup_dir(v1, "hugetlb", "/docker/x") is None  # not mounted here: not limited by it
    v2 = tmp_path / "v2"
    v2.mkdir()
    (v2 / "cgroup.controllers").write_text("cpu memory\n")
    assert become.cgroup_dir(v2, "", "/system.slice/docker-x.scope") == v2 / "system.slice/docker-x.scope"


def test_a_process_of_this_namespace_is_no_target() -> None:
    """The fork server forks into containers only: a process in its own PID namespace is refused."""
    with pytest.raises(become.BecomeError, match="shares this process's PID namespace"):
        become.read_target(os.getpid())
    with pytest.raises(become.BecomeError, match="cannot read process"):
        become.read_target(2**22 + 1)


def test_this_process_has_its_own_credentials() -> None:
    status = become.parse_status(Path("/proc/self/status").read_text())
    target = become.Target(os.getpid(), (), status)
    assert target.uid == os.geteuid() and target.gid == os.getegid()
    become.check_same(target)  # the same process: nothing differs


@pytest.mark.parametrize(("request_", "error"), [
    ({"target": 1, "env": {}, "argv": []}, "target must be a host pid > 1"),
    ({"target": True, "env": {}, "argv": []}, "target must be"),
    ({"target": 55, "env": {"A=B": "c"}, "argv": []}, "env must be"),
    ({"target": 55, "env": {"A": 3}, "argv": []}, "env must be"),
    ({"target": 55, "env": {}, "cwd": "relative", "argv": []}, "cwd must be an absolute path"),
    ({"target": 55, "env": {}, "argv": "--socket x"}, "argv must be a list of strings"),
])
def test_fork_requests_are_checked_field_by_field(request_: dict[str, object], error: str) -> None:
    with pytest.raises(RequestError, match=error):
        parse_fork({"cmd": "fork", **request_})


def test_a_good_fork_request() -> None:
    fork = parse_fork({"cmd": "fork", "target": 55, "env": {"PATH": "/bin"}, "argv": ["--socket", "/s"]})
    assert (fork.target, fork.env, fork.cwd, fork.argv) == (55, {"PATH": "/bin"}, "/", ["--socket", "/s"])


def _standin(run_dir: Path, agent: list[str]) -> subprocess.Popen[str]:
    command = standin_command(str(run_dir), "/unused.sock", ["torch"])
    cut = command.index("--")
    return subprocess.Popen([sys.executable, *command[1:cut + 1], *agent], text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def test_the_standin_becomes_the_agent_when_told_to_fall_back(tmp_path: Path) -> None:
    proc = _standin(tmp_path, [sys.executable, "-c", "import os; print('agent', os.getpid()); raise SystemExit(7)"])
    time.sleep(0.2)
    assert proc.poll() is None  # waiting for a word
    (tmp_path / "agent.fallback").write_text("no fork\n")
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 7 and f"agent {proc.pid}" in out  # exec'd: the same process


def test_the_standin_ends_with_the_forked_agent_and_its_exit_code(tmp_path: Path) -> None:
    agent = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    proc = _standin(tmp_path, ["false"])
    (tmp_path / "agent.pid").write_text(f"{agent.pid}\n")
    time.sleep(0.3)
    assert proc.poll() is None  # watching
    (tmp_path / "agent.exit").write_text("3\n")
    agent.kill()
    agent.wait()
    proc.communicate(timeout=30)
    assert proc.returncode == 3


def test_the_forked_agent_is_told_where_to_write_its_pid() -> None:
    argv = forked_agent_argv("/squall/run", "/squall/run/agent.sock", ("torch", "squall.worker.warm"))
    assert argv == ["--socket", "/squall/run/agent.sock", "--preload", "torch,squall.worker.warm",
                    "--pid-file", "/squall/run/agent.pid"]
