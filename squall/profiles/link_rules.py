"""The rules between the parts of one link's settings, each declared once.

Each function says whether its rule holds. Every place that checks a link calls them, with its own
message and the names it knows the values by: a profile as it is read (:mod:`.link_values`,
:mod:`.resolve`), a hand-built LinkSpec (:mod:`.settings`) and the delay daemon's configuration
(``squall.shaping.nfqueue.config``). The values are in their canonical units (:mod:`.settings`):
probabilities and correlations as fractions, times in integer microseconds. The bounds of a single
value (a probability in [0, 1], a correlation below 1) are in :mod:`.bounds`.
"""

from __future__ import annotations

from typing import Final

GEMODEL_PARTS: Final = ("p", "r", "loss_bad", "loss_good")  # GilbertElliott's probabilities


def correlated_only_if_set(chance: float, correlation: float) -> bool:
    """A correlation belongs to a chance (or a jitter amount) that is set: with none it means nothing."""
    return chance > 0 or correlation == 0


def reorder_has_delay(reorder: float, delay_us: int) -> bool:
    """A reordered packet skips the delay: a link that reorders needs one (netem never reorders without)."""
    return reorder == 0 or delay_us > 0


def one_loss_model(probability: float, gemodel: object | None) -> bool:
    """Random loss and Gilbert-Elliott bursts are two loss models: a link has at most one."""
    return gemodel is None or probability == 0


def gemodel_moves(p: float, r: float) -> bool:
    """A Gilbert-Elliott chain with p = r = 0 never changes state."""
    return p + r > 0
