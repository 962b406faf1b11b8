"""Entering network namespaces from the host: ``setns(2)`` through ctypes (Python 3.11 has no os.setns).

The daemon stays in the host namespace. To serve a container it enters the container's namespace
on the calling thread, creates a socket there and comes back; the socket keeps belonging to the
namespace it was created in, so one process can hold sockets in many namespaces and poll them
all. Failing to come back is fatal (everything afterwards would happen in the wrong namespace),
so that raises :class:`RuntimeError` rather than a recoverable error.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import socket
from collections.abc import Iterator

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
