"""Error feedback for compressed SGD: none, EF14, EF21 and EF21M, and the algorithm that runs them.

A biased compressor ``C`` (Top-K, ARC-Top-K) loses what it drops; error feedback keeps it and
sends it later. Per step, on worker ``i`` with gradient ``g_i``, a variant says what to compress
(:meth:`ErrorFeedback.prepare`) and, given this worker's compressed vector ``c_i`` and the
workers' mean ``c = mean_j c_j``, which direction the optimiser takes (:meth:`ErrorFeedback.absorb`):

=========  ==========================================  ==================================  ==========
variant    compress                                    then                                direction
=========  ==========================================  ==================================  ==========
``none``   ``g_i``                                     \\-                                  ``c``
``ef14``   ``p_i = e_i + g_i``                         ``e_i = p_i - c_i``                 ``c``
``ef21``   ``g_i - E_i``                               ``E_i += c_i``, ``Ē += c``          ``Ē``
``ef21m``  ``v_i - E_i``, ``v_i = b v_i + (1-b) g_i``  ``E_i += c_i``, ``Ē += c``          ``Ē``
=========  ==========================================  ==================================  ==========

EF14 is the classic error accumulation (Seide et al. 2014); EF21 (Richtárik et al. 2021) keeps a
local estimate ``E_i`` and the global one ``Ē = mean_i E_i`` and compresses the *change*; EF21M
(Fatkhullin et al. 2023; ARC-Top-K's default) does so on a momentum ``v_i`` (written here as an
average, ``(1 - b)`` on the gradient, so the learning rate keeps its meaning). As in the ARC-Top-K
hook, EF21 and EF21M start with one dense all-reduce (``E_i = v_i = g_i``, ``Ē = mean g``;
:attr:`ErrorFeedback.needs_start`) unless ``dense_start`` is off (then all start at zero).

:class:`CompressedSGD` is the :class:`~squall.training.algorithms.Algorithm` over one all-reduce
and a compressor, the way hivemind hands a compression to its averager: each compressed step is
``mean = allreduce(vector, k, compression=C, local=c_i)`` (:class:`AllReduce`: a protocol binds
:func:`squall.collectives.allreduce` to its transport), which all-gathers Top-K, ring-all-reduces
Rand-K's and ARC-Top-K's shared coordinates, and so on, as the compressor declares; the dense
first step is the same call without compression.
"""

from __future__ import annotations

from collections.abc import Awaitable
from dataclasses import dataclass
from typing import Protocol

import torch

from squall.training.algorithms.base import Algorithm
from squall.training.compress.base import Compression
from squall.training.optim import Sgd

#: Error-feedback variants, by name.
EF_VARIANTS = ("none", "ef14", "ef21", "ef21m")


class AllReduce(Protocol):
    """A mean all-reduce over the workers, optionally compressed (:func:`squall.collectives.bind` makes one).

    ``local``, when given, receives this worker's own compressed vector (float32, the tensor's size).
    """

    def __call__(self, tensor: torch.Tensor, round: int, *, compression: Compression | None = None,
                 local: torch.Tensor | None = None) -> Awaitable[torch.Tensor]:
        """The mean of every worker's ``tensor`` (of its compression, when one is given)."""
        ...


@dataclass(frozen=True, slots=True)
class FeedbackConfig:
    """Which error feedback, and its settings."""

    variant: str = "ef21m"  # one of EF_VARIANTS
    beta: float = 0.9  # EF21M's momentum
    dense_start: bool = True  # EF21/EF21M: a dense all-reduce at the first step initialises the estimates

    def __post_init__(self) -> None:
        if self.variant not in EF_VARIANTS:
            raise ValueError(f"ef = {self.variant!r} is not an error-feedback variant; allowed: {list(EF_VARIANTS)}")
        if not 0 <= self.beta < 1:
            raise ValueError(f"beta = {self.beta} must be in [0, 1)")


class ErrorFeedback:
    """One worker's error-feedback state (see the module docstring)."""

    def __init__(self, config: FeedbackConfig | None = None) -> None:
        self.config = config or FeedbackConfig()
        self.variant = self.config.variant
        self._e: torch.Tensor | None = None  # ef14: the residual e_i; ef21/ef21m: E_i
        self._global: torch.Tensor | None = None  # ef21/ef21m: Ē
        self._v: torch.Tensor | None = None  # ef21m: the momentum v_i
        self._pending: torch.Tensor | None = None  # ef14: p_i between prepare and absorb
        self.started = False

    @property
    def needs_start(self) -> bool:
        """True until the dense first step EF21/EF21M want has been taken."""
        return self.variant in ("ef21", "ef21m") and self.config.dense_start and not self.started

    def start(self, grad: torch.Tensor, mean_grad: torch.Tensor) -> torch.Tensor:
        """The dense first step: ``E_i = v_i = g_i``, ``Ē = mean g``; returns the direction ``Ē``."""
        self._e, self._v = grad.detach().clone(), grad.detach().clone()
        self._global = mean_grad.detach().clone()
        self.started = True
        return self._global.clone()

    def prepare(self, grad: torch.Tensor) -> torch.Tensor:
        """The vector this worker compresses this step."""
        self.started = True
        if self.variant == "none":
            return grad
        if self.variant == "ef14":
            self._pending = grad + self._e if self._e is not None else grad.clone()
            return self._pending
        if self._e is None:
            self._e = torch.zeros_like(grad)
            self._global = torch.zeros_like(grad)
        if self.variant == "ef21":
            return grad - self._e
        self._v = grad.clone() * (1 - self.config.beta) if self._v is None else \
            self._v.mul_(self.config.beta).add_(grad, alpha=1 - self.config.beta)
        return self._v - self._e

    def absorb(self, local: torch.Tensor, mean: torch.Tensor) -> torch.Tensor:
        """Take this worker's compressed vector and the workers' mean; returns the optimiser's direction."""
        if self.variant == "none":
            return mean
        if self.variant == "ef14":
            assert self._pending is not None, "absorb before prepare"
            self._e, self._pending = self._pending - local, None
            return mean
        assert self._e is not None and self._global is not None, "absorb before prepare"
        self._e.add_(local)
        self._global.add_(mean)
        return self._global.clone()

    def residual_norm(self) -> float:
        """``||e_i||`` (EF14) or ``||v_i - E_i||`` / ``||g - E_i||``'s last state: what is still owed."""
        if self.variant == "ef14" and self._e is not None:
            return float(self._e.norm())
        if self.variant == "ef21m" and self._v is not None and self._e is not None:
            return float((self._v - self._e).norm())
        return 0.0


class CompressedSGD(Algorithm):
    """Synchronous SGD over a compressed all-reduce with error feedback.

    :param allreduce: see :class:`AllReduce`; called with ``compression`` for the compressed steps and
        without for EF21/EF21M's dense first step.
    :param compression: what every compressed step sends (:meth:`compression_for` may refine it per vector).
    :param feedback: the error-feedback variant and settings.
    :param name: the algorithm's name in metrics (the protocol's).
    """

    name = "compressed_sgd"

    def __init__(self, allreduce: AllReduce, compression: Compression, *, feedback: FeedbackConfig | None = None,
                 optimizer: Sgd | None = None, name: str | None = None) -> None:
        super().__init__(optimizer=optimizer)
        self.name = name or type(self).name  # the protocol's algorithm name, in metrics
        self.allreduce, self.compression = allreduce, compression
        self.feedback = ErrorFeedback(feedback)
        self.dense_steps = 0
        self.compressed_steps = 0

    def compression_for(self, vector: torch.Tensor) -> Compression:
        """The compression of ``vector`` (:attr:`compression`; a protocol may pick one by the vector's size)."""
        return self.compression

    async def step(self, k: int, params: torch.Tensor, grad: torch.Tensor, lr: float) -> torch.Tensor:
        if self.feedback.needs_start:
            self.dense_steps += 1
            direction = self.feedback.start(grad, await self.allreduce(grad, k))
        else:
            self.compressed_steps += 1
            vector = self.feedback.prepare(grad)
            local = torch.empty(vector.shape, dtype=torch.float32)
            mean = await self.allreduce(vector, k, compression=self.compression_for(vector), local=local)
            direction = self.feedback.absorb(local, mean)
        return self.optimizer.update(params, direction, lr)

    def stats(self) -> dict[str, float]:
        return {"dense_steps": self.dense_steps, "compressed_steps": self.compressed_steps,
                "ef_residual": self.feedback.residual_norm()}


@dataclass(frozen=True)
class FeedbackOptions:
    """The error-feedback options of a compressed protocol: the base of its options dataclass.

    A protocol's class sets its own default for ``ef`` (Top-K: ef14, Rand-K: none, ARC-Top-K: ef21m).
    """

    ef: str = "ef21m"  # one of EF_VARIANTS
    beta: float = 0.9  # EF21M's momentum, in [0, 1)
    dense_start: bool = True  # EF21/EF21M: a dense all-reduce at the first step initialises the estimates

    def __post_init__(self) -> None:
        self.feedback()  # checks ef and beta

    def feedback(self) -> FeedbackConfig:
        """The error feedback these options ask for."""
        return FeedbackConfig(variant=self.ef, beta=self.beta, dense_start=self.dense_start)
