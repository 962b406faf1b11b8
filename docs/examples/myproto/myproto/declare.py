"""What myproto declares to Squall, registered under the entry point ``squall.protocols`` (pyproject.toml).

``pairavg`` is a short name for matrices, markers and ``squall run --protocol pairavg``: Squall's
shared ``train`` job builds the algorithm ``pair_average`` by name on every rank. Squall copies this
package and its installed metadata into the containers, so the catalog there finds the same names.

This module is read on the host to list and check protocols: it imports no torch and no transport
(the builder imports the protocol when a rank builds it).
"""

from __future__ import annotations

from typing import Any

from squall.training.declaration import AlgorithmDeclaration, Declaration


def build(transport: Any, optimizer: Any, options: dict[str, Any]) -> Any:
    """``(transport, local optimiser, options) -> Algorithm``: PairAverage takes no options."""
    from myproto.protocol import PairAverage

    return PairAverage(transport, optimizer)


DECLARATIONS = (
    AlgorithmDeclaration("pair_average", build),
    Declaration("pairavg", "pairwise hypercube averaging, one partner per step (myproto)", "train",
                {"algorithm": "pair_average"}),
)
