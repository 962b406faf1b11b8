"""DeMo: decoupled momentum, chunked DCT top-k all-gathered, sign update."""

from __future__ import annotations

from typing import Any

from squall.protocols.demo.optimizer import DeMo
from squall.training.algorithms.base import Algorithm
from squall.training.declaration import AlgorithmDeclaration, Declaration
from squall.training.optim import Sgd
from squall.transport import Transport

PAPER = "DeMo: Peng, Quesnelle, Kingma, arXiv 2411.19870"


def build_demo(transport: Transport, sgd: Sgd, options: dict[str, Any]) -> Algorithm:
    """Builder of ``demo``: ``beta`` (0.999), ``k`` (32), ``chunk`` (64), ``weight_decay`` (0), ``timeout``."""
    if options.pop("payload", None) is not None:
        raise ValueError("demo does not emulate a payload: its all-gather carries the task's own coefficients")
    timeout = options.pop("timeout", None)
    return DeMo(transport, beta=float(options.pop("beta", 0.999)), k=int(options.pop("k", 32)),
                chunk=int(options.pop("chunk", 64)), weight_decay=float(options.pop("weight_decay", 0.0)),
                timeout=None if timeout is None else float(timeout))


DECLARATIONS = (
    AlgorithmDeclaration(DeMo.name, build_demo, "beta, k, chunk, weight_decay, timeout"),
    Declaration(DeMo.name, "DeMo: the top 32 DCT coefficients of every 64 x 64 chunk of the momentum all-gathered, "
                "sign update", "train", {"algorithm": DeMo.name, "algorithm_args": {"k": 32, "chunk": 64}},
                paper=PAPER, needs=frozenset({"tcp", "device_model"})),
)
