"""Entering a container's network namespace from the host, safely, one thread at a time.

How: ``setns(2)`` on the *calling thread* only (network namespaces are per thread), through
ctypes because Python 3.11 has no ``os.setns``. Inside, the thread creates netlink sockets (they
stay bound to the namespace they were created in, so pyroute2 then uses them from outside) and
spawns ``iptables-restore`` (a child starts in its parent thread's namespace, so no ``nsenter``).
Then the thread returns to where it was. Nothing is ever mounted, so no named entry appears in
``/var/run/netns``, and many worker threads can each be in a different namespace at once.

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
import os
from collections.abc import Iterator

from squall.shaping.base import ShapingError
from squall.shaping.netns import entered_fd


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
