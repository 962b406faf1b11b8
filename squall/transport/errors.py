"""Transport errors: a deadline passed, a peer is gone, or this endpoint is closed."""

from __future__ import annotations


class TransportError(Exception):
    """Base class of every error a transport raises on purpose."""


class TransportTimeout(TransportError, TimeoutError):
    """An operation did not finish before its deadline.

    :param operation: what was attempted (``"recv"``, ``"send"``, ``"connect"``...).
    :param peer: the peer involved, or ``None`` for "any peer".
    :param timeout: the deadline that passed, in seconds.
    """

    def __init__(self, operation: str, peer: int | None, timeout: float | None) -> None:
        who = "any peer" if peer is None else f"peer {peer}"
        super().__init__(f"{operation} with {who} timed out after {timeout} s")
        self.operation = operation
        self.peer = peer
        self.timeout = timeout


class PeerFailed(TransportError):
    """A peer is known to be gone: it closed, its connection broke, or it stopped answering.

    Messages that arrived before the failure are still delivered; after them every receive
    from (and send to) that peer raises this error.
    :param peer: the failed peer, or ``None`` when every peer has failed.
    :param reason: what was observed (EOF, reset, missed heartbeats, a closing ``BYE``...).
    """

    def __init__(self, peer: int | None, reason: str) -> None:
        who = "every peer" if peer is None else f"peer {peer}"
        super().__init__(f"{who} failed: {reason}")
        self.peer = peer
        self.reason = reason


class TransportClosed(TransportError):
    """This endpoint was closed; no more sends or receives."""
