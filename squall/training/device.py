"""Emulated compute speed: how long one training step's compute phase lasts on this node.

The harness cannot slow a CPU down, so a node's speed is emulated: the real model is tiny and
the compute phase of step ``k`` is padded with a sleep until it lasts::

    step_time_s * step_factor(k)      (when step_time_s is set)
    real_compute * step_factor(k)     (when it is not: only the slow-down is emulated)

A step whose real compute is longer than its emulated duration cannot be shortened: it lasts its
real time, and :meth:`DeviceModel.overrun` says by how much. The loop adds the overruns up and a
run whose total passes :data:`OVERRUN_TOLERANCE` of the time its steps took is reported as an
invalid emulation (:func:`emulation_valid`), not silently as a slower device.

``step_factor(k) = slowdown x (straggler_factor with probability straggler_probability) x
LogNormal(0, noise_sigma)``, drawn from a generator seeded by (seed, node, step). This is the
only definition of the draws: the harness's ``DeviceSpec`` is plain data (its ``to_dict()`` is
this model's configuration), and a check that recomputes what each node was told to do builds a
:class:`DeviceModel` from it. Nothing here imports the harness.

Micro-batches (gradient accumulation: DropCompute, Non-blocking SGD). Micro-batch ``i`` of ``M``
in step ``k`` lasts ``step_time_s / M x microbatch_factor(k, i)`` (or its real compute time times
the factor when ``step_time_s`` is unset), where::

    microbatch_factor(k, i) = step_factor(k) x (1 + 0.5 x microbatch_delay_factor x mult(k, i))

and ``mult(k, i)`` is DropCompute's per-micro-batch straggler multiplier (``microbatch_noise =
"dropcompute-lognormal"``, see :func:`dropcompute_lognormal`), drawn from its own generator seeded
by (seed, node, step, index), so that the per-step draws of ``step_factor`` are the same with or
without it. Without micro-batch noise ``microbatch_factor(k, i) = step_factor(k)``: a straggling
step slows each of its micro-batches alike.

Mapping to the paper's code (``deepspeed-bert/run_pretraining.py``): after each micro-batch, whose
measured time is ``t``, it sleeps ``mult x t x 0.5 x delay_factor`` more, ``mult`` drawn by
``choose_from_dist(create_dist_lognormal())``. Here ``t`` is the nominal micro-batch time
(``step_time_s / M``; the real time when unset) and the sleep is folded into the factor above, so a
micro-batch lasts ``t x (1 + 0.5 x delay_factor x mult)``: on average ``1 + 0.5 x delay_factor``
times the nominal (1.5x for the paper's ``delay_factor`` 1). Not modelled here, because they are
the protocol's business: the paper injects nothing during its first ``MIN_DROP_STEP`` = 5 steps,
cuts the sleep where it would pass DropCompute's threshold, and its ``t`` also includes the
all-reduce and optimizer step of the last micro-batch of a step.
"""

from __future__ import annotations

import bisect
import functools
import math
import random
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from squall.training.options import option_keys, read_options

DROPCOMPUTE_LOGNORMAL: Final = "dropcompute-lognormal"  # the one micro-batch noise distribution
MICROBATCH_NOISES: Final = (DROPCOMPUTE_LOGNORMAL,)
PAPER_DELAY_SCALE: Final = 0.5  # the paper's sleep is mult x t x 0.5 x delay_factor
MAX_DELAY_FACTOR: Final = 100.0  # a micro-batch at most 1 + 0.5 x 100 x 11.4 = 571x its nominal time
_LOGNORMAL_MU: Final = 4.0  # create_dist_lognormal: mu = 4, sigma = 1 over the lengths 1..999
_LOGNORMAL_SIGMA: Final = 1.0
_LOGNORMAL_LENGTHS: Final = range(1, 1000)


@functools.cache
def dropcompute_lognormal() -> tuple[tuple[float, ...], tuple[float, ...]]:
    """DropCompute's straggler multipliers and their probabilities (the paper's ``create_dist_lognormal``).

    A log-normal density (mu 4, sigma 1) evaluated at the lengths 1..999,
    ``p(L) ~ (1/L) exp(-(ln L - 4)^2 / 2)``, normalised to sum 1; the multipliers are
    ``L / E[L]`` (E[L] ~ 87.6), so their mean is exactly 1 (s.d. ~ 1.16, from ~ 0.011 to ~ 11.4).
    """
    weights = [
        math.exp(-((math.log(length) - _LOGNORMAL_MU) ** 2) / (2 * _LOGNORMAL_SIGMA**2)) / length
        for length in _LOGNORMAL_LENGTHS
    ]
    total = math.fsum(weights)
    probabilities = tuple(weight / total for weight in weights)
    mean_length = math.fsum(p * length for p, length in zip(probabilities, _LOGNORMAL_LENGTHS, strict=True))
    return tuple(length / mean_length for length in _LOGNORMAL_LENGTHS), probabilities


@functools.cache
def _dropcompute_cdf() -> tuple[float, ...]:
    """Cumulative probabilities of :func:`dropcompute_lognormal`, the last forced to 1."""
    _, probabilities = dropcompute_lognormal()
    running, cdf = 0.0, []
    for probability in probabilities:
        running += probability
        cdf.append(running)
    cdf[-1] = 1.0
    return tuple(cdf)


#: A run's emulation is invalid when real compute outlasted the emulated steps by more than this
#: fraction of the time the steps took: the run is then that much slower than the emulated device
#: would have made it, and its compute utilization that much too low.
OVERRUN_TOLERANCE: Final = 0.01


def emulation_valid(overrun_s: float, steps_s: float) -> bool:
    """True when the steps' total overrun is within :data:`OVERRUN_TOLERANCE` of the time the steps took.

    Measured against the steps' time, not the emulated compute alone: one late step among slow,
    communication-bound steps changes that run's timings (and its utilization) by its share of them.
    """
    return overrun_s <= OVERRUN_TOLERANCE * steps_s


@dataclass(frozen=True)
class DeviceModel:
    """Compute speed of one node (see the module docstring)."""

    node: int = 0  # the node (rank) the draws are for
    seed: int = 0  # the profile's device seed
    step_time_s: float | None = None  # modelled compute time of one step; None = the real compute time
    slowdown: float = 1.0  # constant factor: 3.0 = three times slower
    straggler_probability: float = 0.0  # chance per step that the step straggles
    straggler_factor: float = 1.0  # how many times longer a straggling step takes
    noise_sigma: float = 0.0  # sigma of multiplicative log-normal noise per step (median 1)
    microbatch_noise: str | None = None  # per-micro-batch straggler draws: None or "dropcompute-lognormal"
    microbatch_delay_factor: float = 0.0  # the paper's delay_factor: extra time mult x t x 0.5 x this

    def __post_init__(self) -> None:
        if self.step_time_s is not None and not self.step_time_s >= 0:
            raise ValueError(f"step_time_s must be >= 0 or None, got {self.step_time_s}")
        if not self.slowdown > 0:
            raise ValueError(f"slowdown must be > 0, got {self.slowdown}")
        if not 0 <= self.straggler_probability <= 1:
            raise ValueError(f"straggler_probability must be in [0, 1], got {self.straggler_probability}")
        if not self.straggler_factor >= 1:
            raise ValueError(f"straggler_factor must be >= 1, got {self.straggler_factor}")
        if not self.noise_sigma >= 0:
            raise ValueError(f"noise_sigma must be >= 0, got {self.noise_sigma}")
        if self.microbatch_noise is not None and self.microbatch_noise not in MICROBATCH_NOISES:
            raise ValueError(
                f"microbatch_noise must be None or one of {list(MICROBATCH_NOISES)}, got {self.microbatch_noise!r}"
            )
        if not 0 <= self.microbatch_delay_factor <= MAX_DELAY_FACTOR:
            raise ValueError(
                f"microbatch_delay_factor must be in [0, {MAX_DELAY_FACTOR:g}], got {self.microbatch_delay_factor}"
            )
        if self.microbatch_noise is None and self.microbatch_delay_factor != 0:
            raise ValueError(
                f"microbatch_delay_factor {self.microbatch_delay_factor} needs a microbatch_noise "
                f"(one of {list(MICROBATCH_NOISES)}); without one it must be 0"
            )

    @classmethod
    def from_config(cls, obj: Mapping[str, Any] | None, *, node: int) -> DeviceModel:
        """From JSON (e.g. the harness's ``DeviceSpec.to_dict()``; its keys are the fields); ``node`` applies
        unless given."""
        return read_options(cls, {"node": node, **(obj or {})}, where="device config")

    @property
    def emulated(self) -> bool:
        """True when steps are padded at all."""
        varies = self.slowdown != 1 or self.straggler_probability > 0 or self.noise_sigma > 0 or self.microbatch_varies
        return self.step_time_s is not None or varies

    def step_factor(self, step: int) -> float:
        """The slow-down of step ``step``: slowdown x straggler x noise, seeded by node and step."""
        if self.straggler_probability == 0 and self.noise_sigma == 0:
            return self.slowdown
        rng = random.Random(f"squall-device:{self.seed}:{self.node}:{step}")
        factor = self.slowdown
        if rng.random() < self.straggler_probability:
            factor *= self.straggler_factor
        if self.noise_sigma > 0:
            factor *= rng.lognormvariate(0.0, self.noise_sigma)
        return factor

    @property
    def mean_factor(self) -> float:
        """The expected step factor (of a step computed whole; see :attr:`mean_microbatch_factor`)."""
        return (
            self.slowdown
            * (1 + self.straggler_probability * (self.straggler_factor - 1))
            * math.exp(self.noise_sigma**2 / 2)
        )

    def nominal_time(self, step: int, real_s: float) -> float:
        """The emulated duration of ``step``'s compute phase: ``step_time_s x factor`` (with ``step_time_s``),
        else ``real_s x max(1, factor)``; what the phase lasts when real compute is no longer."""
        if self.step_time_s is not None:
            return self.step_time_s * self.step_factor(step)
        return real_s * max(1.0, self.step_factor(step))

    def compute_time(self, step: int, real_s: float) -> float:
        """How long the compute phase of ``step`` should last, given that real compute took ``real_s``."""
        return max(real_s, self.nominal_time(step, real_s))

    def overrun(self, step: int, real_s: float) -> float:
        """Seconds by which real compute of ``real_s`` outlasted the emulated step (0 without ``step_time_s``).

        Such a step lasted longer than the device it emulates: the run is then slower than the
        emulated accelerator would be (see :func:`emulation_valid`).
        """
        if self.step_time_s is None:
            return 0.0
        return max(0.0, real_s - self.nominal_time(step, real_s))

    def settings(self) -> dict[str, Any]:
        """The configuration as plain data (its fields, the keys of :meth:`from_config`), for results."""
        return {key: getattr(self, key) for key in option_keys(DeviceModel)}

    def padding(self, step: int, real_s: float) -> float:
        """Seconds to sleep after real compute of ``real_s`` so that the step lasts :meth:`compute_time`."""
        return max(0.0, self.compute_time(step, real_s) - real_s)

    # -- micro-batches (gradient accumulation: DropCompute, Non-blocking SGD) ------------------------
    @property
    def microbatch_varies(self) -> bool:
        """True when micro-batches draw their own noise (on top of their step's factor)."""
        return self.microbatch_noise is not None and self.microbatch_delay_factor > 0

    def microbatch_multiplier(self, step: int, index: int) -> float:
        """The paper's ``mult`` for micro-batch ``index`` of ``step`` (mean 1); 0 without micro-batch noise.

        Drawn from :func:`dropcompute_lognormal` by a generator seeded by (seed, node, step, index)
        alone: the same for any number of micro-batches per step and any order of calls.
        """
        if self.microbatch_noise is None:
            return 0.0
        if step < 0 or index < 0:
            raise ValueError(f"micro-batch {index} of step {step}: need step >= 0 and index >= 0")
        rng = random.Random(f"squall-microbatch:{self.seed}:{self.node}:{step}:{index}")
        multipliers, _ = dropcompute_lognormal()
        return multipliers[bisect.bisect_right(_dropcompute_cdf(), rng.random())]

    def microbatch_factor(self, step: int, index: int) -> float:
        """The slow-down of micro-batch ``index`` of ``step``: the step's factor (a straggling step
        slows every micro-batch of it) times ``1 + 0.5 x microbatch_delay_factor x mult`` with
        micro-batch noise (see the module docstring)."""
        factor = self.step_factor(step)
        if not self.microbatch_varies:
            return factor
        mult = self.microbatch_multiplier(step, index)
        return factor * (1 + PAPER_DELAY_SCALE * self.microbatch_delay_factor * mult)

    @property
    def mean_microbatch_factor(self) -> float:
        """The expected micro-batch factor: ``mean_factor x (1 + 0.5 x microbatch_delay_factor)``.

        The step's and the micro-batch's draws are independent and ``mult`` has mean 1.
        """
        if not self.microbatch_varies:
            return self.mean_factor
        return self.mean_factor * (1 + PAPER_DELAY_SCALE * self.microbatch_delay_factor)

    def microbatch_time(self, step: int, index: int, count: int, real_s: float) -> float:
        """How long micro-batch ``index`` of ``count`` in ``step`` should last, given real compute ``real_s``.

        With ``step_time_s`` set, a nominal micro-batch takes ``step_time_s / count``; without it,
        the real compute time; either is multiplied by :meth:`microbatch_factor`.
        """
        if count < 1 or not 0 <= index < count:
            raise ValueError(f"micro-batch {index} of {count}: need 0 <= index < count")
        if self.step_time_s is not None:
            return max(real_s, self.step_time_s / count * self.microbatch_factor(step, index))
        return real_s * max(1.0, self.microbatch_factor(step, index))

    def microbatch_padding(self, step: int, index: int, count: int, real_s: float) -> float:
        """Seconds to sleep after real compute of ``real_s`` so the micro-batch lasts :meth:`microbatch_time`."""
        return max(0.0, self.microbatch_time(step, index, count, real_s) - real_s)
