"""Entering a network namespace from the host, one thread at a time, and knowing it is the same one.

How: ``setns(2)`` on the *calling thread* only (network namespaces are per thread), through
ctypes because Python 3.11 has no ``os.setns``. Inside, the thread creates sockets (netlink ones
for pyroute2 and the tc executors, a queue socket for the delay daemon, a UDP one for a probe):
a socket stays bound to the namespace it was created in, so one process can hold sockets in many
namespaces and use them from outside. A child process started inside (``iptables-restore``)
starts in its parent thread's namespace, so no ``nsenter``. Then the thread returns to where it
was. Nothing is ever mounted, so no named entry appears in ``/var/run/netns``, and many worker
threads can each be in a different namespace at once. Failing to come back is fatal (everything
afterwards would happen in the wrong namespace), so that raises :class:`RuntimeError` rather than
a recoverable error.

Why not ``pyroute2.NetNS(path)``: in pyroute2 0.9.7 it forks a helper process per socket (7 ms
instead of 0.5 ms here) and, with its default ``O_CREAT`` flag, a missing path can create a new
namespace instead of failing.

Identity: a container's namespace is named by ``/proc/<pid>/ns/net``; when the container dies, the
pid can be reused by an unrelated process. :class:`Namespace` records the namespace's inode when
it is first seen and refuses to enter anything else (:class:`NamespaceGone`), so shaping never
lands in the wrong namespace. The check and the ``setns`` use the same open file descriptor.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
from collections.abc import Iterator

from squall.shaping.base import ShapingError

CLONE_NEWNET = 0x40000000
_libc = ctypes.CDLL(None, use_errno=True)


def netns_of_pid(pid: int) -> str:
    """Path of the network namespace of process ``pid`` (e.g. a container's first process)."""
    return f"/proc/{pid}/ns/net"


def netns_of_name(name: str) -> str:
    """Path of a namespace created with ``ip netns add``."""
    return f"/run/netns/{name}"


def setns(fd: int, what: str) -> None:
    """Move the calling thread into the network namespace open at ``fd`` (``what`` names it in errors)."""
    if _libc.setns(fd, CLONE_NEWNET) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"setns({what}): {os.strerror(err)}")


@contextlib.contextmanager
def entered_fd(fd: int, what: str) -> Iterator[None]:
    """Run the body with the calling thread inside the namespace open at ``fd``, then return home.

    :raises OSError: when the namespace cannot be entered (before the body runs).
    """
    home = os.open("/proc/thread-self/ns/net", os.O_RDONLY | os.O_CLOEXEC)
    try:
        setns(fd, what)
        try:
            yield
        finally:
            try:
                setns(home, "home namespace")
            except OSError as exc:  # pragma: no cover - the kernel never refuses our own namespace
                raise RuntimeError(f"cannot return to the host network namespace: {exc}") from exc
    finally:
        os.close(home)


@contextlib.contextmanager
def entered(path: str) -> Iterator[None]:
    """Run the body with the calling thread inside the network namespace at ``path``."""
    target = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        with entered_fd(target, path):
            yield
    finally:
        os.close(target)


def socket_in(path: str, family: int, kind: int, proto: int = 0) -> socket.socket:
    """A socket created inside the namespace at ``path`` (it stays bound to that namespace)."""
    with entered(path):
        return socket.socket(family, kind, proto)


def same_namespace(path: str, other: str = "/proc/thread-self/ns/net") -> bool:
    """Whether two namespace paths name the same namespace (compares device and inode)."""
    a, b = os.stat(path), os.stat(other)
    return (a.st_dev, a.st_ino) == (b.st_dev, b.st_ino)


class NamespaceGone(ShapingError):
    """The namespace no longer exists (its process died), or the path now names another one."""


def identity_of(path: str) -> tuple[int, int]:
    """(device, inode) of a namespace file; raises :class:`NamespaceGone` if it does not exist."""
    try:
        st = os.stat(path)
    except FileNotFoundError:
        raise NamespaceGone(f"network namespace {path} does not exist") from None
    return st.st_dev, st.st_ino


class Namespace:
    """A network namespace known by path and pinned by identity."""

    def __init__(self, path: str):
        self.path = path
        self.identity = identity_of(path)

    def __repr__(self) -> str:
        return f"Namespace({self.path!r}, inode={self.identity[1]})"

    def alive(self) -> bool:
        """Whether the path still names the namespace first seen there."""
        try:
            return identity_of(self.path) == self.identity
        except NamespaceGone:
            return False

    @contextlib.contextmanager
    def entered(self) -> Iterator[None]:
        """Run the body with the calling thread inside the namespace."""
        try:
            target = os.open(self.path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            raise NamespaceGone(f"network namespace {self.path} does not exist") from None
        try:
            st = os.fstat(target)
            if (st.st_dev, st.st_ino) != self.identity:
                raise NamespaceGone(f"{self.path} now names another namespace (its process was replaced)")
            with contextlib.ExitStack() as stack:
                try:
                    stack.enter_context(entered_fd(target, self.path))
                except OSError as exc:
                    raise ShapingError(f"cannot enter network namespace {self.path}: {exc.strerror}") from exc
                yield
        finally:
            os.close(target)
