"""``squall.log``: one line in a user's program gives Squall its figures, in the protocols' record format.

In a program run by ``squall run -- python train.py`` (the code is mounted in every container, so
nothing has to be installed)::

    from squall import log

    log(step=step, loss=loss.item(), tokens_per_s=rate)

Each call writes one line to the process's stdout: :data:`~squall.programs.lines.LOG_PREFIX` and a
JSON object. The command runner reads it as it arrives, checks it, adds the time it was read and
writes it to the rank's ``metrics.jsonl`` beside the records Squall's own protocols write, so time
to target, bytes to target and the report's plots work for it as for a protocol. Outside Squall
(``SQUALL_OUT_DIR`` unset) nothing is written. Stdlib only: it is imported by user programs.
"""

from __future__ import annotations

import json
import math
import os
import sys
from typing import Any

PREFIX = "@squall "  # the same as squall.programs.lines.LOG_PREFIX (a test checks they agree)
ENV = "SQUALL_OUT_DIR"  # set by the command runner for every rank


def log(step: int | None = None, **figures: Any) -> dict[str, Any]:
    """Record ``figures`` (numbers; ``loss``, ``accuracy`` and ``eval_loss`` are the ones targets use) at ``step``.

    :returns: the record as written (also outside Squall, where it is not written).
    :raises TypeError: a figure is not a number, a boolean, None or a string; ``step`` is not an int.
    """
    if step is not None and (isinstance(step, bool) or not isinstance(step, int)):
        raise TypeError(f"squall.log: step must be an int, got {type(step).__name__}")
    record: dict[str, Any] = {} if step is None else {"step": step}
    for name, given in figures.items():
        value = given.item() if hasattr(given, "item") and callable(given.item) else given  # a tensor or numpy scalar
        if value is not None and not isinstance(value, bool | int | float | str):
            raise TypeError(f"squall.log: {name}={value!r:.60} is not a number")
        record[name] = None if isinstance(value, float) and not math.isfinite(value) else value
    if os.environ.get(ENV):
        line = PREFIX + json.dumps(record, separators=(",", ":")) + "\n"
        sys.stdout.flush()  # what the program printed before comes before the record
        os.write(sys.stdout.fileno(), line.encode())
    return record
