"""Teardown on every way out: normal exit, exceptions, SIGINT/SIGTERM/SIGHUP, and interpreter exit.

SIGTERM and SIGHUP are turned into ``SystemExit`` in the main thread (SIGINT already raises
``KeyboardInterrupt``), so ``with Cluster(...)`` blocks unwind and tear down. An ``atexit`` hook
closes whatever is still open. During a teardown, signals are held and re-delivered afterwards, so
a second Ctrl-C does not leave half a cluster behind. What survives even that (SIGKILL, a power
cut) is found by ``squall gc`` through the labels.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import signal
import threading
import weakref
from collections.abc import Iterator
from types import FrameType
from typing import Protocol

logger = logging.getLogger(__name__)


class Closable(Protocol):
    def close(self) -> None: ...


_open: weakref.WeakSet[Closable] = weakref.WeakSet()
_installed = False
_lock = threading.Lock()


def _raise_exit(signum: int, _frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


def _close_all() -> None:
    for obj in list(_open):
        try:
            obj.close()
        except Exception:
            logger.exception("teardown at exit failed; run 'squall gc'")


def register(obj: Closable) -> None:
    """Track ``obj`` until :func:`unregister`; install the signal and exit hooks on first use."""
    global _installed
    with _lock:
        _open.add(obj)
        if _installed:
            return
        _installed = True
    atexit.register(_close_all)
    if threading.current_thread() is threading.main_thread():
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) in (signal.SIG_DFL, None):
                signal.signal(sig, _raise_exit)


def unregister(obj: Closable) -> None:
    """Stop tracking ``obj``."""
    _open.discard(obj)


@contextlib.contextmanager
def signals_held() -> Iterator[None]:
    """Hold SIGINT/SIGTERM/SIGHUP for the duration (main thread only), then deliver the first one."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    pending: list[int] = []
    sigs = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
    previous = {s: signal.getsignal(s) for s in sigs}

    def _hold(signum: int, _frame: FrameType | None) -> None:
        pending.append(signum)

    for s in sigs:
        signal.signal(s, _hold)
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        if pending:
            signal.raise_signal(pending[0])
