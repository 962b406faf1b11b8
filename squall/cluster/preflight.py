"""Before a run starts anything: can this process reach the engine and shape links? (:func:`preflight`)

``squall run``, ``matrix``, ``calibrate``, ``demo`` (and ``compare``) and the pytest plugin call
:func:`preflight` once their input is read and before a container, a network or a qdisc exists. It
checks what every run on the local engine needs and names what is missing:

* **privileges**: shaping enters the containers' network namespaces (``setns``: ``CAP_SYS_ADMIN``)
  and writes qdiscs and iptables rules there (``CAP_NET_ADMIN``): both capabilities in the effective
  set, as root has them (a uid of 0 whose capabilities were dropped does not pass);
* **the Docker socket**: where ``DOCKER_HOST`` is unset or a ``unix://`` path, the socket exists and
  this user may connect to it (an engine behind ``tcp://`` or ``ssh://`` is asked when the run
  starts, and its failure is exit 3 too);
* **the backend asked for**: ``netem`` forced on a kernel without ``sch_netem`` (the netem probe of
  :func:`squall.shaping.select.netem_probe`, a qdisc added in a scratch namespace that vanishes with
  it); the ``nfqueue`` backend, forced or as the fallback, needs ``iptables`` on the host.

A run on the ``swarm`` engine shapes on each node through that node's agent: only the socket is
checked here. :func:`reasons` is pure (facts in, reasons out); :func:`gather` reads the machine and
starts nothing. The error, :class:`NotReady`, is an environment not ready: the CLI maps it to exit
code 3 and the plugin fails the cell (``CI=true``) or skips it, each with the reasons and the pointer
to ``squall doctor``, which shows the whole picture and how to fix each part.
"""

from __future__ import annotations

import errno
import logging
import os
import shutil
import socket
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import urlparse

from squall.cluster.errors import ClusterError
from squall.cluster.spec import LOCAL, default_engine

logger = logging.getLogger(__name__)

#: Linux capability numbers (linux/capability.h) of what shaping needs, by name.
CAPABILITIES = {"CAP_NET_ADMIN": 12, "CAP_SYS_ADMIN": 21}
DEFAULT_SOCKET = "/var/run/docker.sock"
DOCTOR = "Run 'squall doctor' to see what this machine has and how to fix each part"
#: The backends a run may force (squall.shaping.base.BACKENDS; kept here so this module stays a reader).
BACKENDS = ("netem", "nfqueue")


class NotReady(ClusterError):
    """This machine cannot start the run asked for; ``reasons`` says why, the message adds what to do."""

    def __init__(self, reasons: tuple[str, ...]) -> None:
        self.reasons = reasons
        super().__init__("the run cannot start here: " + "; ".join(reasons) + f". {DOCTOR}")


@dataclass(frozen=True)
class HostAccess:
    """What :func:`reasons` judges, read by :func:`gather`."""

    user: str  # who runs this process, e.g. "root" or "nobody (uid 65534)"
    capabilities: frozenset[str]  # effective capabilities among CAPABILITIES, by name
    socket_problem: str  # why the engine's socket cannot be used, "" when it can (or is not a socket)
    netem: tuple[bool, str] | None  # the netem probe's answer and reason; None when it was not asked
    iptables: str | None  # the path of iptables, None when it is not on PATH


def effective_capabilities(status: str) -> frozenset[str]:
    """The capabilities of :data:`CAPABILITIES` set in the ``CapEff`` line of ``/proc/<pid>/status`` text."""
    for line in status.splitlines():
        key, _, value = line.partition(":")
        if key == "CapEff":
            bits = int(value.strip(), 16)
            return frozenset(name for name, bit in CAPABILITIES.items() if bits >> bit & 1)
    return frozenset()


def socket_path(docker_host: str | None) -> str | None:
    """The unix socket the engine is reached through, or None when ``DOCKER_HOST`` names another transport."""
    if not docker_host:
        return DEFAULT_SOCKET
    parsed = urlparse(docker_host)
    return parsed.path if parsed.scheme == "unix" else None


def socket_problem(path: str | None, user: str) -> str:
    """Why this process cannot connect to the engine's unix socket at ``path``; '' when it can (or no socket)."""
    if path is None:
        return ""
    denied = (f"{user} may not use the Docker socket {path} (permission denied): run as root (sudo), or as a "
              "member of the socket's group")
    try:
        os.stat(path)
    except FileNotFoundError:
        return (f"no Docker engine socket at {path}: the engine is not installed or not running "
                "(scripts/ensure-docker.sh installs and starts one)")
    except PermissionError:  # a folder on the way is closed to this user
        return denied
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5.0)
        try:
            sock.connect(path)
        except PermissionError:
            return denied
        except OSError as exc:
            if exc.errno == errno.ECONNREFUSED:
                return f"nothing listens on the Docker socket {path}: the engine is not running"
            return f"the Docker socket {path} cannot be reached: {exc.strerror or exc}"
    return ""


def reasons(access: HostAccess, backend: str | None, *, engine: str) -> tuple[str, ...]:
    """Everything that stops a run with ``backend`` (None: chosen by probing) on ``engine`` (pure)."""
    if backend is not None and backend not in BACKENDS:
        return (f"unknown shaping backend {backend!r}: choose one of {', '.join(BACKENDS)}",)
    found: list[str] = []
    if access.socket_problem:
        found.append(access.socket_problem)
    if engine != LOCAL:  # the nodes' agents shape on their own kernels
        return tuple(found)
    lacking = [c for c in CAPABILITIES if c not in access.capabilities]
    if lacking:
        found.append(f"{access.user} lacks {' and '.join(lacking)}: shaping enters the containers' network "
                     "namespaces and writes qdiscs and iptables rules there (run as root with its capabilities: "
                     "sudo; in a container, --cap-add NET_ADMIN --cap-add SYS_ADMIN)")
        return tuple(found)  # without the privileges, the probes below only repeat it
    netem_ok, netem_why = access.netem if access.netem is not None else (False, "not probed")
    if backend == "netem" and not netem_ok:
        found.append(f"the netem backend was asked for, but it cannot run here: {netem_why} (the kernel needs "
                     "sch_netem, e.g. the linux-modules-extra package of an Ubuntu kernel; without it, the "
                     "nfqueue backend works: drop --backend netem or pass --backend nfqueue)")
    wants_nfqueue = backend == "nfqueue" or (backend is None and not netem_ok)
    if wants_nfqueue and access.iptables is None:
        why = "was asked for" if backend == "nfqueue" else f"is the fallback here (netem: {netem_why})"
        found.append(f"the nfqueue backend {why}, but iptables is not on PATH (install the iptables package)")
    return tuple(found)


def _user() -> str:
    uid = os.geteuid()
    try:
        import pwd

        name = pwd.getpwuid(uid).pw_name
    except KeyError:
        name = "uid"
    return "root" if uid == 0 else f"{name} (uid {uid})"


def gather(backend: str | None, *, engine: str) -> HostAccess:
    """Read what :func:`reasons` needs; the netem probe only where it is asked for and could run."""
    try:
        status = Path("/proc/self/status").read_text()
    except OSError:
        status = ""
    caps = effective_capabilities(status)
    user = _user()
    netem: tuple[bool, str] | None = None
    if engine == LOCAL and caps >= set(CAPABILITIES) and backend in (None, "netem"):
        from squall.shaping.select import netem_probe

        probe = netem_probe()
        netem = (probe.available, probe.reason)
    return HostAccess(user=user, capabilities=caps,
                      socket_problem=socket_problem(socket_path(os.environ.get("DOCKER_HOST")), user),
                      netem=netem, iptables=shutil.which("iptables"))


def preflight(backend: str | None, *, engine: str | None) -> None:
    """Check that a run with ``backend`` (None: netem where the kernel has it) on ``engine`` can start here.

    :param engine: ``local`` or ``swarm``; None: the process's default (``--engine``, ``$SQUALL_ENGINE``).
    :raises NotReady: with every reason found (the CLI's exit code 3).
    """
    engine = engine or default_engine()
    found = reasons(gather(backend, engine=engine), backend, engine=engine)
    if found:
        raise NotReady(found)
    logger.debug("preflight: ready for backend %s on the %s engine", backend or "(probed)", engine)
