"""The preflight's pure parts (squall/cluster/preflight.py): capabilities read from /proc, the engine's
socket (real unix sockets in a temporary folder), and the reasons a run cannot start.

The CLI run as an unprivileged user and with a backend the kernel lacks: tests/integration/test_preflight.py.
"""

from __future__ import annotations

import os
import shutil
import socket
import tempfile
from pathlib import Path

import pytest

from squall.cluster.errors import ClusterError
from squall.cluster.preflight import (
    CAPABILITIES,
    HostAccess,
    NotReady,
    effective_capabilities,
    reasons,
    socket_path,
    socket_problem,
)

BOTH = frozenset(CAPABILITIES)


def _access(*, caps: frozenset[str] = BOTH, socket_problem: str = "", netem: tuple[bool, str] | None = (True, "ok"),
            iptables: str | None = "/usr/sbin/iptables") -> HostAccess:
    return HostAccess(user="someone (uid 1000)", capabilities=caps, socket_problem=socket_problem, netem=netem,
                      iptables=iptables)


@pytest.mark.parametrize(("cap_eff", "expected"), [
    ("000001ffffffffff", BOTH),  # root's full set
    ("0000000000001000", frozenset({"CAP_NET_ADMIN"})),  # bit 12 only
    ("0000000000200000", frozenset({"CAP_SYS_ADMIN"})),  # bit 21 only
    ("0000000000000000", frozenset()),  # a uid 0 whose capabilities were dropped, or any user
])
def test_capabilities_come_from_the_capeff_line(cap_eff: str, expected: frozenset[str]) -> None:
    status = f"Name:\tpython\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\nCapEff:\t{cap_eff}\n"
    assert effective_capabilities(status) == expected


def test_this_process_status_parses() -> None:
    text = Path("/proc/self/status").read_text()
    caps = effective_capabilities(text)
    line = next(x for x in text.splitlines() if x.startswith("CapEff:"))
    assert ("CAP_NET_ADMIN" in caps) == bool(int(line.split()[1], 16) & (1 << 12))


@pytest.mark.parametrize(("docker_host", "expected"), [
    (None, "/var/run/docker.sock"), ("", "/var/run/docker.sock"), ("unix:///run/user/1000/docker.sock",
                                                                   "/run/user/1000/docker.sock"),
    ("tcp://10.0.0.5:2376", None), ("ssh://me@host", None),
])
def test_the_socket_is_the_unix_path_of_docker_host(docker_host: str | None, expected: str | None) -> None:
    assert socket_path(docker_host) == expected


def test_a_socket_that_listens_passes_and_the_others_say_why(tmp_path: Path) -> None:
    listening = tmp_path / "engine.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(listening))
        server.listen(1)
        assert socket_problem(str(listening), "me") == ""
    # the server closed: the file stays, nothing listens
    assert "nothing listens on the Docker socket" in socket_problem(str(listening), "me")
    assert "no Docker engine socket at" in socket_problem(str(tmp_path / "absent.sock"), "me")
    assert socket_problem(None, "me") == ""  # tcp:// or ssh://: asked when the run starts


@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to hand the socket to another user")
def test_a_socket_this_user_may_not_open_says_permission_denied() -> None:
    """A forked child drops to nobody and asks; root bypasses file permissions, nobody does not."""
    folder = Path(tempfile.mkdtemp(prefix="squall-preflight-"))  # /tmp: a path nobody can walk
    folder.chmod(0o755)
    path = folder / "engine.sock"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as server:
        server.bind(str(path))
        server.listen(1)
        path.chmod(0o600)
        read, write = os.pipe()
        pid = os.fork()
        if pid == 0:  # pragma: no cover - the child: never returns into pytest
            try:
                os.close(read)
                os.setgid(65534)
                os.setuid(65534)
                os.write(write, socket_problem(str(path), "nobody").encode())
            finally:
                os._exit(0)
        os.close(write)
        answer = b""
        while chunk := os.read(read, 4096):
            answer += chunk
        os.close(read)
        os.waitpid(pid, 0)
    shutil.rmtree(folder)
    assert "nobody may not use the Docker socket" in answer.decode() and "permission denied" in answer.decode()


def test_everything_there_is_ready() -> None:
    assert reasons(_access(), None, engine="local") == ()
    assert reasons(_access(netem=(False, "no sch_netem")), None, engine="local") == ()  # the nfqueue fallback
    assert reasons(_access(), "nfqueue", engine="local") == ()


def test_no_capabilities_is_one_reason_not_a_cascade() -> None:
    found = reasons(_access(caps=frozenset({"CAP_NET_ADMIN"}), netem=None), "netem", engine="local")
    assert len(found) == 1 and "lacks CAP_SYS_ADMIN" in found[0] and "sudo" in found[0]
    found = reasons(_access(caps=frozenset(), netem=None, socket_problem="permission denied"), None, engine="local")
    assert found[0] == "permission denied" and "lacks CAP_NET_ADMIN and CAP_SYS_ADMIN" in found[1]


def test_a_forced_backend_the_host_lacks_is_named_with_the_way_out() -> None:
    (netem,) = reasons(_access(netem=(False, "the kernel has no sch_netem qdisc")), "netem", engine="local")
    assert "the netem backend was asked for" in netem and "no sch_netem qdisc" in netem
    assert "linux-modules-extra" in netem and "--backend nfqueue" in netem
    (nfq,) = reasons(_access(iptables=None), "nfqueue", engine="local")
    assert "nfqueue backend was asked for" in nfq and "iptables is not on PATH" in nfq
    (fallback,) = reasons(_access(netem=(False, "no sch_netem"), iptables=None), None, engine="local")
    assert "is the fallback here (netem: no sch_netem)" in fallback
    assert reasons(_access(iptables=None), None, engine="local") == ()  # netem shapes: iptables unused
    assert "unknown shaping backend 'tc'" in reasons(_access(), "tc", engine="local")[0]


def test_on_a_swarm_only_the_engine_is_checked_here() -> None:
    access = _access(caps=frozenset(), netem=None, iptables=None)
    assert reasons(access, None, engine="swarm") == ()
    assert reasons(_access(socket_problem="no socket"), None, engine="swarm") == ("no socket",)


def test_the_error_is_an_environment_error_pointing_at_doctor() -> None:
    exc = NotReady(("a", "b"))
    assert isinstance(exc, ClusterError) and exc.reasons == ("a", "b")
    assert str(exc).startswith("the run cannot start here: a; b.") and "squall doctor" in str(exc)
