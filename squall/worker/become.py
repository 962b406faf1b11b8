"""Become another container's process: join its cgroups, enter its namespaces, take its credentials.

The fork server (:mod:`squall.worker.forkserver`) has imported torch once; each worker's agent is a
fork of it that does here what ``docker exec`` does for a new process, in this order:

1. :func:`read_target` reads what the container's own first process (its ``docker-init``, by host
   pid) has: cgroups, namespaces, uid, gid, groups and capability sets, while this process still sees
   the host's ``/proc``;
2. :func:`join_cgroups` writes this process into each of the container's cgroups, so the container's
   memory and pid limits, its accounting and ``docker pause`` (the freezer) hold for the agent;
3. :func:`enter_namespaces` enters cgroup, ipc, uts, net, pid and mount namespaces (mount last: after
   it the host's paths are gone; pid applies to the children, so the caller forks once more);
4. in that child, :func:`take_credentials` drops the capabilities the container lacks and takes its
   uid, gid and groups, and :func:`check_same` compares the result with the target, refusing to go
   on (the caller exits) if anything differs.

Docker's seccomp filter is the fork server container's (Docker's default, with the rules it adds for
``CAP_SYS_ADMIN``); the capabilities that those rules are about are dropped in step 4.
Plain stdlib and ``ctypes``, Linux only.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from pathlib import Path

#: Entered in this order; ``mnt`` last because entering it replaces the root and the working directory.
NAMESPACES = ("cgroup", "ipc", "uts", "net", "pid", "mnt")
CAP_SETPCAP = 8
_LINUX_CAPABILITY_VERSION_3 = 0x20080522
_PR_CAPBSET_DROP = 24
_PR_CAP_AMBIENT = 47
_PR_CAP_AMBIENT_CLEAR_ALL = 4
_STATUS_KEYS = ("Uid", "Gid", "Groups", "CapInh", "CapPrm", "CapEff", "CapBnd", "CapAmb", "NoNewPrivs")


class BecomeError(RuntimeError):
    """A step that failed, with what it was doing."""


@dataclass(frozen=True)
class Target:
    """What a container's own process has, read from the host's ``/proc``."""

    pid: int  # host pid
    cgroups: tuple[tuple[str, str], ...]  # (hierarchy's controllers, path) as /proc/PID/cgroup lists them
    status: tuple[tuple[str, str], ...]  # the credential lines of /proc/PID/status (_STATUS_KEYS)

    def field(self, key: str) -> str:
        """One of the status lines' values."""
        return dict(self.status)[key]

    @property
    def uid(self) -> int:
        """The effective uid."""
        return int(self.field("Uid").split()[1])

    @property
    def gid(self) -> int:
        """The effective gid."""
        return int(self.field("Gid").split()[1])

    @property
    def groups(self) -> list[int]:
        """Supplementary groups."""
        return [int(g) for g in self.field("Groups").split()]

    def caps(self, key: str) -> int:
        """A capability set (``CapEff`` etc.) as a bit mask."""
        return int(self.field(key), 16)


def parse_status(text: str) -> tuple[tuple[str, str], ...]:
    """The credential lines of a ``/proc/PID/status`` text, in :data:`_STATUS_KEYS` order."""
    found = {}
    for line in text.splitlines():
        key, _, value = line.partition(":")
        if key in _STATUS_KEYS:
            found[key] = " ".join(value.split())
    missing = [k for k in _STATUS_KEYS if k not in found]
    if missing:
        raise BecomeError(f"/proc status lacks {', '.join(missing)}")
    return tuple((k, found[k]) for k in _STATUS_KEYS)


def parse_cgroups(text: str) -> tuple[tuple[str, str], ...]:
    """``/proc/PID/cgroup`` as (controllers, path) pairs; ``""`` controllers is the v2 hierarchy."""
    pairs = []
    for line in text.splitlines():
        if not line.strip():
            continue
        parts = line.split(":", 2)
        if len(parts) != 3:
            raise BecomeError(f"unexpected /proc cgroup line {line!r}")
        pairs.append((parts[1], parts[2]))
    return tuple(pairs)


def read_target(pid: int, proc: Path = Path("/proc")) -> Target:
    """What host process ``pid`` has: cgroups and credentials. Only a process in a PID namespace other
    than this one's (a container's) is a target: the fork server is not a way into the host."""
    try:
        if os.stat(proc / str(pid) / "ns" / "pid").st_ino == os.stat("/proc/self/ns/pid").st_ino:
            raise BecomeError(f"process {pid} shares this process's PID namespace: not a container's")
        cgroups = parse_cgroups((proc / str(pid) / "cgroup").read_text())
        status = parse_status((proc / str(pid) / "status").read_text())
    except OSError as exc:
        raise BecomeError(f"cannot read process {pid}: {exc}") from exc
    return Target(pid, cgroups, status)


def cgroup_dir(root: Path, controllers: str, path: str) -> Path | None:
    """Where the hierarchy ``controllers`` (as /proc/PID/cgroup names it) is mounted below ``root``.

    v1: ``root/cpu,cpuacct/...`` (``name=systemd`` is ``root/systemd``); v2 (``""``): ``root`` itself,
    or ``root/unified`` on a hybrid host. None when that hierarchy is not mounted there.
    """
    rel = path.lstrip("/")
    if controllers == "":
        if (root / "unified").is_dir():
            return root / "unified" / rel
        return root / rel if (root / "cgroup.controllers").exists() else None
    name = controllers.removeprefix("name=")
    for candidate in (name, *name.split(",")):
        if (root / candidate).is_dir():
            return root / candidate / rel
    return None


def join_cgroups(target: Target, root: Path) -> None:
    """Move this process into each of ``target``'s cgroups (``root``: the host's cgroup mount)."""
    for controllers, path in target.cgroups:
        where = cgroup_dir(root, controllers, path)
        if where is None:
            continue  # a hierarchy this host does not mount where we look: nothing is limited by it
        try:
            (where / "cgroup.procs").write_text(f"{os.getpid()}\n")
        except OSError as exc:
            raise BecomeError(f"cannot join cgroup {controllers or 'v2'}:{path}: {exc}") from exc
    mine = parse_cgroups(Path("/proc/self/cgroup").read_text())
    if mine != target.cgroups:
        raise BecomeError(f"cgroups after joining {dict(mine)} differ from the container's {dict(target.cgroups)}")


def _libc() -> ctypes.CDLL:
    return ctypes.CDLL(None, use_errno=True)


def enter_namespaces(pid: int, proc: Path = Path("/proc")) -> None:
    """Enter host process ``pid``'s namespaces (:data:`NAMESPACES`); needs CAP_SYS_ADMIN and one thread."""
    libc = _libc()
    fds = []
    try:
        for ns in NAMESPACES:  # open all first: after mnt, the host's /proc is gone
            mine, theirs = os.stat(f"/proc/self/ns/{ns}"), os.stat(proc / str(pid) / "ns" / ns)
            if (mine.st_dev, mine.st_ino) != (theirs.st_dev, theirs.st_ino):
                fds.append((ns, os.open(proc / str(pid) / "ns" / ns, os.O_RDONLY | os.O_CLOEXEC)))
        for ns, fd in fds:
            if libc.setns(fd, 0) != 0:
                err = ctypes.get_errno()
                raise BecomeError(f"setns into {ns} namespace of {pid}: {os.strerror(err)}")
    except OSError as exc:
        raise BecomeError(f"cannot open the namespaces of {pid}: {exc}") from exc
    finally:
        for _, fd in fds:
            os.close(fd)


class _CapHeader(ctypes.Structure):
    _fields_ = [("version", ctypes.c_uint32), ("pid", ctypes.c_int)]


class _CapData(ctypes.Structure):
    _fields_ = [("effective", ctypes.c_uint32), ("permitted", ctypes.c_uint32), ("inheritable", ctypes.c_uint32)]


def take_credentials(target: Target) -> None:
    """Drop to ``target``'s capability sets, groups, gid and uid (this process only)."""
    libc = _libc()
    bounding = target.caps("CapBnd")
    last_cap = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    for cap in range(last_cap + 1):
        if not bounding >> cap & 1 and libc.prctl(_PR_CAPBSET_DROP, cap, 0, 0, 0) != 0:
            raise BecomeError(f"cannot drop capability {cap} from the bounding set: "
                              f"{os.strerror(ctypes.get_errno())}")
    libc.prctl(_PR_CAP_AMBIENT, _PR_CAP_AMBIENT_CLEAR_ALL, 0, 0, 0)
    os.setgroups(target.groups)
    os.setgid(target.gid)
    os.setuid(target.uid)  # a uid other than 0 clears the permitted and effective sets here
    header = _CapHeader(_LINUX_CAPABILITY_VERSION_3, 0)
    data = (_CapData * 2)()
    for i in range(2):
        data[i].effective = target.caps("CapEff") >> (32 * i) & 0xFFFFFFFF
        data[i].permitted = target.caps("CapPrm") >> (32 * i) & 0xFFFFFFFF
        data[i].inheritable = target.caps("CapInh") >> (32 * i) & 0xFFFFFFFF
    if libc.capset(ctypes.byref(header), data) != 0:
        raise BecomeError(f"capset: {os.strerror(ctypes.get_errno())}")


def check_same(target: Target) -> None:
    """Refuse (:class:`BecomeError`) unless this process's credentials are ``target``'s."""
    mine = parse_status(Path("/proc/self/status").read_text())
    if mine != target.status:
        diff = {k: (v, dict(mine)[k]) for k, v in target.status if dict(mine)[k] != v}
        raise BecomeError(f"credentials differ from the container's (theirs, mine): {diff}")
