"""What a SwarmSGD node did, counted for its metrics records (``swarm_*`` fields)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass
class Counters:
    """What the node did so far (cumulative)."""

    offers: int = 0  # offers started
    completed: int = 0  # own offers answered and applied
    answered: int = 0  # offers of others answered and applied
    busy_sent: int = 0  # offers refused with BUSY
    busy_received: int = 0  # own offers refused
    offer_fallbacks: int = 0  # own offers resent in full precision
    decode_failures: int = 0  # offers of others that failed their checksum here
    timeouts: int = 0  # own offers given up
    bad_frames: int = 0  # malformed messages dropped
    vectors_sent: int = 0  # snapshots sent (offers, answers, resends)
    bits_sent: int = 0  # their bits per coordinate, summed
    last_distance: float = 0.0  # sup distance to the last partner at exchange time

    def as_record(self) -> dict[str, float]:
        """Fields for a metrics record."""
        return {
            "swarm_offers": self.offers,
            "swarm_completed": self.completed,
            "swarm_answered": self.answered,
            "swarm_busy_sent": self.busy_sent,
            "swarm_busy_received": self.busy_received,
            "swarm_fallbacks": self.offer_fallbacks,
            "swarm_decode_failures": self.decode_failures,
            "swarm_timeouts": self.timeouts,
            "swarm_mean_bits": round(self.bits_sent / self.vectors_sent, 3) if self.vectors_sent else 0.0,
            "swarm_distance": round(self.last_distance, 6),
        }
