"""Per-peer traffic counters.

``bytes_*`` and ``messages_*`` count application messages (the frames passed to ``send`` and
returned by ``recv``), header included, exactly as they appear on the wire, so
``bytes_sent`` on one end equals ``bytes_received`` on the other once everything arrived.
Transport housekeeping (handshakes, heartbeats, goodbyes) is counted apart, in
``overhead_bytes_*``, so that protocol tests can compare their traffic with cost models.
"""

from __future__ import annotations

from dataclasses import dataclass, fields, replace


@dataclass(slots=True)
class PeerCounters:
    """Traffic exchanged with one peer."""

    bytes_sent: int = 0  # wire bytes of application messages sent to the peer
    bytes_received: int = 0  # wire bytes of application messages received from it
    messages_sent: int = 0  # application messages (frames or datagrams) sent
    messages_received: int = 0  # application messages received
    overhead_bytes_sent: int = 0  # handshake, heartbeat and goodbye bytes sent
    overhead_bytes_received: int = 0  # handshake, heartbeat and goodbye bytes received

    def record_sent(self, nbytes: int, *, overhead: bool = False) -> None:
        """Count one frame of ``nbytes`` sent."""
        if overhead:
            self.overhead_bytes_sent += nbytes
        else:
            self.bytes_sent += nbytes
            self.messages_sent += 1

    def record_received(self, nbytes: int, *, overhead: bool = False) -> None:
        """Count one frame of ``nbytes`` received."""
        if overhead:
            self.overhead_bytes_received += nbytes
        else:
            self.bytes_received += nbytes
            self.messages_received += 1

    def copy(self) -> PeerCounters:
        """An independent snapshot."""
        return replace(self)

    def __add__(self, other: PeerCounters) -> PeerCounters:
        return PeerCounters(*(getattr(self, f.name) + getattr(other, f.name) for f in fields(self)))
