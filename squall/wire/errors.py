"""The one exception the wire layer raises for bad input."""

from __future__ import annotations


class WireError(ValueError):
    """Bytes that do not decode to a valid message, or a message that cannot be encoded.

    Every rejection in :mod:`squall.wire` is a ``WireError``: no ``struct.error``,
    ``UnicodeDecodeError``, ``MemoryError`` or ``RecursionError`` leaks out of the codec.
    :param reason: a short human-readable explanation (also the ``str()`` of the error).
    """

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason
