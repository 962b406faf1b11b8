"""DeMo: decoupled momentum, chunked DCT top-k all-gathered, sign update."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from squall.protocols.demo.optimizer import DeMo
from squall.training.algorithms.base import Algorithm
from squall.training.declaration import AlgorithmDeclaration, Declaration
from squall.training.optim import Sgd
from squall.transport import Transport

PAPER = "DeMo: Peng, Quesnelle, Kingma, arXiv 2411.19870"


@dataclass(frozen=True)
class DemoOptions:
    """DeMo's options (``algorithm_args``)."""

    beta: float = 0.999  # momentum decay
    k: int = 32  # DCT coefficients kept per chunk
    chunk: int = 64  # chunk side
    weight_decay: float = 0.0  # decoupled weight decay
    timeout: float | None = None  # per send/receive (None: the transport's default)
    payload: Any = None  # the run's emulated payload (put here by the train job): refused

    def __post_init__(self) -> None:
        if self.payload is not None:
            raise ValueError("demo does not emulate a payload: its all-gather carries the task's own coefficients")


def build_demo(transport: Transport, sgd: Sgd, options: DemoOptions) -> Algorithm:
    """Builder of ``demo`` (options: :class:`DemoOptions`)."""
    return DeMo(transport, beta=options.beta, k=options.k, chunk=options.chunk, weight_decay=options.weight_decay,
                timeout=options.timeout)


DECLARATIONS = (
    AlgorithmDeclaration(DeMo.name, build_demo, DemoOptions),
    Declaration(DeMo.name, "DeMo: the top 32 DCT coefficients of every 64 x 64 chunk of the momentum all-gathered, "
                "sign update", "train", {"algorithm": DeMo.name, "algorithm_args": {"k": 32, "chunk": 64}},
                paper=PAPER, needs=frozenset({"tcp", "device_model"})),
)
