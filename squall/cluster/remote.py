"""Is the Docker engine we talk to on this machine? The local engine may only shape if it is.

The local engine shapes a worker by entering ``/proc/<State.Pid>/ns/net``. ``State.Pid`` is a pid
in the *engine's* host: with ``DOCKER_HOST`` pointing at another machine (``tcp://10.1.2.3:2376``,
``ssh://build-box``, or a local port or Unix socket forwarded to a remote engine) the same number
names an unrelated process here, and shaping would change some other namespace. So before the
local engine shapes anything it asks :func:`require_local_engine`, which gathers evidence and
refuses (:class:`RemoteEngineError`, pointing to ``--engine swarm``) when any of it says *remote*:

1. **the address** (pure, :func:`parse_docker_host` and :func:`address_is_local`): a ``tcp://`` or
   ``ssh://`` host that is not an address of this machine is remote; a Unix socket or a local
   address says nothing yet (a forwarded socket looks local);
2. **the kernel**: the engine reports its host's kernel release; a different release is another
   kernel, so another machine (or a VM);
3. **the engine id file**: engines from Docker 23 on keep their id in ``<DockerRootDir>/engine-id``;
   where that file is readable here it must hold the id the engine reports;
4. **a container's pid** (the proof): for a running container of the engine, ``/proc/<pid>`` here
   must be that container, i.e. its ``cgroup`` (or, under a private cgroup namespace, its
   ``mountinfo``) names the container id. A pid that does not exist here, or is some other process,
   proves the engine is elsewhere.

An engine with no evidence against it is local; :class:`Locality` says whether that was proved
(a container pid matched, the id file matched) or only not contradicted (an engine with no running
container yet; the local engine passes its first container to make it a proof).

The decision (:func:`decide`) is pure over the gathered facts, so it is unit-tested without an
engine; :func:`gather` is the part that reads the engine and ``/proc``.
"""

from __future__ import annotations

import contextlib
import errno
import ipaddress
import logging
import os
import socket
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

from docker.errors import NotFound

from squall.cluster.errors import ClusterError

logger = logging.getLogger(__name__)

DEFAULT_SOCKET = "/var/run/docker.sock"
SCHEMES = ("unix", "tcp", "ssh", "npipe", "fd", "http", "https")
#: How many running containers :func:`gather` checks when the caller names none.
PID_SAMPLE = 3


class RemoteEngineError(ClusterError):
    """The Docker engine is not on this machine, so the local engine cannot shape its containers."""


# -- the address --------------------------------------------------------------------------------
@dataclass(frozen=True)
class EngineAddress:
    """Where ``DOCKER_HOST`` points: ``scheme`` and either ``host`` (+ ``port``) or ``path``."""

    scheme: str  # one of SCHEMES
    host: str = ""  # tcp/ssh/http(s): the host name or address, no brackets
    port: int | None = None
    path: str = ""  # unix/npipe: the socket's path
    raw: str = ""  # the value as given ("" = DOCKER_HOST unset)

    def __str__(self) -> str:
        return self.raw or f"unix://{DEFAULT_SOCKET} (DOCKER_HOST unset)"


def parse_docker_host(value: str | None) -> EngineAddress:
    """``DOCKER_HOST`` as an :class:`EngineAddress`; unset or empty means the default Unix socket.

    :raises ValueError: a scheme Docker does not know, or a tcp/ssh address with no host.
    """
    if value is None or not value.strip():
        return EngineAddress("unix", path=DEFAULT_SOCKET)
    raw = value.strip()
    if "://" not in raw:
        raise ValueError(f"DOCKER_HOST={raw!r} has no scheme; allowed: {', '.join(s + '://' for s in SCHEMES)}")
    scheme = raw.split("://", 1)[0].lower()
    if scheme not in SCHEMES:
        raise ValueError(f"DOCKER_HOST={raw!r}: unknown scheme {scheme!r}; allowed: {', '.join(SCHEMES)}")
    if scheme in ("unix", "npipe"):
        return EngineAddress(scheme, path=raw.split("://", 1)[1] or DEFAULT_SOCKET, raw=raw)
    if scheme == "fd":
        return EngineAddress(scheme, raw=raw)
    parts = urlsplit(raw)
    try:
        port = parts.port
    except ValueError as exc:
        raise ValueError(f"DOCKER_HOST={raw!r}: bad port ({exc})") from exc
    if not parts.hostname:
        raise ValueError(f"DOCKER_HOST={raw!r}: a {scheme}:// address needs a host")
    return EngineAddress(scheme, host=parts.hostname, port=port, raw=raw)


def address_is_local(host: str) -> bool:
    """Whether ``host`` is an address of this machine: loopback, or one a socket can bind here.

    Binding is the kernel's own answer (EADDRNOTAVAIL for an address no interface holds); a name
    is resolved first and is local when every address it resolves to is. A name that does not
    resolve is not local.
    """
    try:
        infos = socket.getaddrinfo(host, None, proto=socket.IPPROTO_TCP)
    except (socket.gaierror, UnicodeError):
        return False
    addresses = {str(info[4][0]) for info in infos}
    return bool(addresses) and all(_bindable(a) for a in addresses)


def _bindable(address: str) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if ip.is_loopback:
        return True
    family = socket.AF_INET6 if ip.version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((address, 0))
        except OSError as exc:
            if exc.errno in (errno.EADDRNOTAVAIL, errno.EINVAL, errno.EAFNOSUPPORT):
                return False
            raise
    return True


# -- facts and the decision ---------------------------------------------------------------------
@dataclass(frozen=True)
class PidFact:
    """One running container as the engine reports it, and what ``/proc/<pid>`` here says."""

    container_id: str
    pid: int
    seen: str  # "match" (this pid is that container), "absent" (no such pid here), "other" (another process)


@dataclass(frozen=True)
class Facts:
    """What :func:`decide` judges; gathered by :func:`gather`, written by hand in the unit tests."""

    address: EngineAddress
    address_local: bool | None  # None for unix/npipe/fd: the address alone cannot tell
    engine_kernel: str = ""  # the engine's KernelVersion ("" if not reported)
    local_kernel: str = ""
    engine_id: str = ""  # the engine's ID
    local_engine_id: str | None = None  # <DockerRootDir>/engine-id here, None if absent or unreadable
    pids: tuple[PidFact, ...] = ()
    engine_name: str = ""  # the engine host's name (reported, never decisive)
    local_name: str = ""


@dataclass(frozen=True)
class Locality:
    """The verdict: is the engine on this machine, was that proved, and the evidence behind it."""

    local: bool
    proved: bool  # local and positively shown (a container pid or the engine id matched)
    address: str
    evidence: tuple[str, ...] = field(default_factory=tuple)


def decide(facts: Facts) -> Locality:
    """Remote if any fact says remote; local otherwise (proved when a fact shows it). Pure."""
    against: list[str] = []
    for_: list[str] = []
    neutral: list[str] = []
    addr = facts.address
    if facts.address_local is False:
        against.append(f"{addr.scheme}:// host {addr.host!r} is not an address of this machine")
    elif facts.address_local is True:
        neutral.append(f"{addr.scheme}:// host {addr.host!r} is an address of this machine")
    else:
        neutral.append(f"{addr.scheme} socket {addr.path or '(inherited)'}: may be forwarded, not proof")
    if facts.engine_kernel and facts.local_kernel:
        if facts.engine_kernel != facts.local_kernel:
            against.append(f"the engine runs kernel {facts.engine_kernel}, this machine {facts.local_kernel}")
        else:
            neutral.append(f"same kernel release {facts.local_kernel}")
    if facts.local_engine_id is not None and facts.engine_id:
        if facts.local_engine_id == facts.engine_id:
            for_.append("the engine's id is the one in this machine's engine-id file")
        else:
            against.append("the engine's id differs from this machine's engine-id file")
    for pf in facts.pids:
        short = pf.container_id[:12]
        if pf.seen == "match":
            for_.append(f"container {short}'s pid {pf.pid} is that container in this machine's /proc")
        elif pf.seen == "absent":
            against.append(f"container {short}'s pid {pf.pid} does not exist on this machine "
                           "(or this process runs in another pid namespace)")
        else:
            against.append(f"container {short}'s pid {pf.pid} is another process on this machine "
                           "(or this process runs in another pid namespace)")
    if facts.engine_name and facts.local_name and facts.engine_name != facts.local_name:
        neutral.append(f"the engine's host is named {facts.engine_name!r}, this one {facts.local_name!r} (a hint only)")
    evidence = tuple(against + for_ + neutral)
    if against:
        return Locality(False, False, str(addr), evidence)
    return Locality(True, bool(for_), str(addr), evidence)


# -- gathering ----------------------------------------------------------------------------------
def container_at_pid(container_id: str, pid: int, proc: Path = Path("/proc")) -> str:
    """``match`` if ``proc/<pid>`` is the container ``container_id``, ``absent``, or ``other``.

    The container's id appears in the pid's cgroup path under Docker's cgroupfs and systemd cgroup
    drivers (``/docker/<id>``, ``docker-<id>.scope``). Under a private cgroup namespace the path is
    ``/``; then the mounts name it (``/var/lib/docker/containers/<id>/hostname`` and friends).
    """
    base = proc / str(pid)
    if pid <= 0 or not base.is_dir():
        return "absent"
    for name in ("cgroup", "mountinfo"):
        with contextlib.suppress(OSError):
            if container_id in (base / name).read_text(errors="replace"):
                return "match"
    return "other" if base.is_dir() else "absent"


def _local_engine_id(root_dir: str) -> str | None:
    if not root_dir:
        return None
    try:
        return (Path(root_dir) / "engine-id").read_text().strip() or None
    except OSError:  # absent (engines before 23 keep no such file), or not readable here
        return None


def _pid_facts(client: Any, container_ids: Sequence[str] | None, proc: Path) -> list[PidFact]:
    """Inspect the given containers (or a few running ones) and look each pid up in ``proc``."""
    if container_ids is None:
        container_ids = [c.id for c in client.containers.list(limit=PID_SAMPLE, filters={"status": "running"})]
    facts: list[PidFact] = []
    for cid in container_ids:
        try:
            state = client.api.inspect_container(cid)
            full, pid = state["Id"], int(state["State"].get("Pid") or 0)
            if not state["State"].get("Running") or pid <= 0:
                continue
            seen = container_at_pid(full, pid, proc)
            if seen != "match":  # it may have stopped between the inspect and the read: ask again
                again = client.api.inspect_container(full)
                if not again["State"].get("Running") or int(again["State"].get("Pid") or 0) != pid:
                    continue
        except NotFound:  # removed meanwhile (another run's container): no evidence either way
            continue
        facts.append(PidFact(full, pid, seen))
    return facts


def gather(client: Any, *, container_ids: Sequence[str] | None = None,
           environ: Mapping[str, str] | None = None, proc: Path = Path("/proc")) -> Facts:
    """The facts about ``client``'s engine (reads the engine, ``DOCKER_HOST`` and ``proc``).

    A remote address short-cuts: the engine is not asked (it may be slow or unreachable).
    """
    env = os.environ if environ is None else environ
    address = parse_docker_host(env.get("DOCKER_HOST"))
    address_local = address_is_local(address.host) if address.host else None
    if address_local is False:
        return Facts(address, False)
    info = client.info()
    return Facts(
        address, address_local,
        engine_kernel=str(info.get("KernelVersion") or ""), local_kernel=os.uname().release,
        engine_id=str(info.get("ID") or ""), local_engine_id=_local_engine_id(str(info.get("DockerRootDir") or "")),
        pids=tuple(_pid_facts(client, container_ids, proc)),
        engine_name=str(info.get("Name") or ""), local_name=socket.gethostname(),
    )


def engine_locality(client: Any, *, container_ids: Sequence[str] | None = None,
                    environ: Mapping[str, str] | None = None, proc: Path = Path("/proc")) -> Locality:
    """:func:`decide` over :func:`gather`: the verdict and its evidence (``squall doctor`` shows it)."""
    return decide(gather(client, container_ids=container_ids, environ=environ, proc=proc))


def require_local_engine(client: Any, *, container_ids: Iterable[str] | None = None,
                         environ: Mapping[str, str] | None = None, proc: Path = Path("/proc")) -> Locality:
    """Refuse to go on unless ``client``'s engine is on this machine.

    :param container_ids: containers of the run to check (their pids are the proof); by default a
        few running containers of the engine, if any.
    :param environ: where to read ``DOCKER_HOST`` (the process's environment by default).
    :param proc: this machine's procfs (a test points it elsewhere to stand for another machine).
    :returns: the verdict (local), for the caller's log.
    :raises RemoteEngineError: the engine is elsewhere; the message gives the evidence and the fix.
    """
    ids = list(container_ids) if container_ids is not None else None
    verdict = engine_locality(client, container_ids=ids, environ=environ, proc=proc)
    if not verdict.local:
        raise RemoteEngineError(
            f"the Docker engine at {verdict.address} is not on this machine ({'; '.join(verdict.evidence)}): "
            "the local engine shapes containers through this machine's /proc/<pid>/ns/net, which would be an "
            "unrelated process here. Use '--engine swarm' (a shaping agent runs on the engine's own node), "
            "or run squall on the engine's host (unset DOCKER_HOST there; inside a container, give it the "
            "host's pid namespace)"
        )
    logger.debug("Docker engine at %s is local (%s): %s", verdict.address,
                 "proved" if verdict.proved else "not contradicted", "; ".join(verdict.evidence))
    return verdict
