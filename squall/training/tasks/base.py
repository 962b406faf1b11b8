"""The :class:`Task` interface: a model that is a function of one flat parameter vector, and its data.

Protocols only ever see a 1-D float tensor of parameters and a gradient of the same shape, so
averaging, gossip, compression and hashing need not know the model. A task lays its weights out
in that vector (:class:`ParamLayout`) and computes the loss from views of it; the gradient comes
from autograd on the flat vector.

Data. A supervised task holds training samples with a *group* per sample (the class label, or a
document / cluster id) that non-IID sharding splits on, and a held-out test split that
:meth:`Task.evaluate` scores. :meth:`Task.batches` draws minibatches from one rank's shard:
the partition depends only on the global seed, the order within it on the seed and the rank.
"""

from __future__ import annotations

import math
from abc import ABC, abstractmethod
from collections.abc import Iterator
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F  # noqa: N812 - the usual torch alias

from squall.training.tasks.sharding import IndexArray, Sharding, derive_seed, shard_indices

#: A minibatch: inputs and targets (for classification, class indices).
Batch = tuple[torch.Tensor, torch.Tensor]

SEED_BATCHES = 0xBA7C
SEED_INIT = 0x1417


class Task(ABC):
    """A training problem over a flat parameter vector."""

    name: str = "task"

    @property
    @abstractmethod
    def dim(self) -> int:
        """Number of parameters (length of the flat vector)."""

    @abstractmethod
    def init_params(self, seed: int) -> torch.Tensor:
        """Initial parameters, a 1-D float32 tensor of length :attr:`dim`; the same for the same seed."""

    @abstractmethod
    def loss_and_grad(self, params: torch.Tensor, batch: Batch) -> tuple[float, torch.Tensor]:
        """The minibatch loss at ``params`` and its gradient (same shape and dtype as ``params``)."""

    @abstractmethod
    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        """Scores on held-out data: at least ``loss``; ``accuracy`` where it means something."""

    @abstractmethod
    def batches(self, rank: int, world: int, seed: int, batch_size: int) -> Iterator[Batch]:
        """An endless stream of minibatches from ``rank``'s shard of the training data."""

    @property
    def tensor_shapes(self) -> tuple[tuple[int, ...], ...] | None:
        """The model's tensors packed in the flat vector, in order; None when it is one vector."""
        return None

    @property
    def tensor_names(self) -> tuple[str, ...] | None:
        """The names of :attr:`tensor_shapes`, in order (None when the task does not name them)."""
        return None


@dataclass(frozen=True)
class ParamLayout:
    """Named tensors packed one after another into a flat vector."""

    shapes: tuple[tuple[str, tuple[int, ...]], ...]  # (name, shape) in packing order

    @property
    def size(self) -> int:
        """Total number of elements."""
        return sum(math.prod(shape) for _, shape in self.shapes)

    def views(self, flat: torch.Tensor) -> dict[str, torch.Tensor]:
        """Views of ``flat`` with the named shapes (gradients flow back to ``flat``)."""
        if flat.dim() != 1 or flat.numel() != self.size:
            raise ValueError(f"expected a flat vector of {self.size} elements, got shape {tuple(flat.shape)}")
        out: dict[str, torch.Tensor] = {}
        offset = 0
        for name, shape in self.shapes:
            n = math.prod(shape)
            out[name] = flat.narrow(0, offset, n).view(shape)
            offset += n
        return out

    def init_uniform(self, seed: int, fan_in: dict[str, int]) -> torch.Tensor:
        """Every tensor uniform in ``+-1/sqrt(fan_in[name])`` (zero where ``fan_in`` lacks the name)."""
        gen = torch.Generator().manual_seed(derive_seed(seed, SEED_INIT))
        flat = torch.zeros(self.size, dtype=torch.float32)
        for name, view in self.views(flat).items():
            if name in fan_in:
                bound = 1.0 / math.sqrt(fan_in[name])
                view.copy_((torch.rand(view.shape, generator=gen) * 2 - 1) * bound)
        return flat


class SupervisedTask(Task):
    """A task over samples: training inputs with a group per sample, and a held-out test split.

    Subclasses define :meth:`loss` (differentiable in ``params``); :meth:`gather` turns sample
    indices into a batch (override it when inputs are built on the fly, e.g. text windows).
    """

    def __init__(self, *, layout: ParamLayout, groups: np.ndarray, sharding: Sharding) -> None:
        self.layout = layout
        self.groups = groups  # one group (label, document) per training sample
        self.sharding = sharding

    @property
    def dim(self) -> int:
        return self.layout.size

    @property
    def tensor_shapes(self) -> tuple[tuple[int, ...], ...]:
        return tuple(shape for _, shape in self.layout.shapes)

    @property
    def tensor_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.layout.shapes)

    @property
    def train_size(self) -> int:
        """Number of training samples."""
        return len(self.groups)

    @abstractmethod
    def loss(self, params: torch.Tensor, batch: Batch) -> torch.Tensor:
        """Mean loss over ``batch`` as a 0-d tensor, differentiable in ``params``."""

    @abstractmethod
    def gather(self, indices: torch.Tensor) -> Batch:
        """The training samples at ``indices``."""

    def loss_and_grad(self, params: torch.Tensor, batch: Batch) -> tuple[float, torch.Tensor]:
        p = params.detach().requires_grad_(True)
        loss = self.loss(p, batch)
        (grad,) = torch.autograd.grad(loss, p)
        return float(loss.detach()), grad

    def shard(self, rank: int, world: int, seed: int) -> IndexArray:
        """``rank``'s training sample indices."""
        return shard_indices(self.groups, rank=rank, world=world, seed=seed, sharding=self.sharding)

    def batches(self, rank: int, world: int, seed: int, batch_size: int) -> Iterator[Batch]:
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        indices = torch.from_numpy(self.shard(rank, world, seed))
        if len(indices) == 0:
            raise ValueError(f"rank {rank} has an empty shard")
        gen = torch.Generator().manual_seed(derive_seed(seed, SEED_BATCHES, rank))
        return self._epochs(indices, batch_size, gen)

    def _epochs(self, indices: torch.Tensor, batch_size: int, gen: torch.Generator) -> Iterator[Batch]:
        """Reshuffle every epoch; a last partial batch is dropped unless the shard is smaller than a batch."""
        size = min(batch_size, len(indices))
        while True:
            order = indices[torch.randperm(len(indices), generator=gen)]
            for start in range(0, len(order) - size + 1, size):
                yield self.gather(order[start : start + size])


class ClassifierTask(SupervisedTask):
    """Cross-entropy classification; :meth:`evaluate` reports test loss and accuracy."""

    def __init__(self, *, layout: ParamLayout, groups: np.ndarray, sharding: Sharding, test: Batch) -> None:
        super().__init__(layout=layout, groups=groups, sharding=sharding)
        self.test = test

    @abstractmethod
    def logits(self, params: torch.Tensor, inputs: torch.Tensor) -> torch.Tensor:
        """Class scores, shape ``(batch, classes)``."""

    def loss(self, params: torch.Tensor, batch: Batch) -> torch.Tensor:
        inputs, targets = batch
        return F.cross_entropy(self.logits(params, inputs), targets)

    @torch.no_grad()
    def evaluate(self, params: torch.Tensor) -> dict[str, float]:
        inputs, targets = self.test
        logits = self.logits(params.detach(), inputs)
        loss = float(F.cross_entropy(logits, targets))
        accuracy = float((logits.argmax(dim=1) == targets).double().mean())
        return {"loss": loss, "accuracy": accuracy}
