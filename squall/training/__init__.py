"""What every training protocol shares: tasks, the training loop, local optimiser, metrics helpers.

* :mod:`~squall.training.tasks`: problems over a flat parameter vector, sharded among ranks;
* :mod:`~squall.training.loop`: :func:`train`, the lock-step loop, with budgets, evaluation and
  emulated device time (:mod:`~squall.training.device`);
* :mod:`~squall.training.run`: the one training driver every loop writes through: the metrics
  record, evaluation fields, stop rules and the final result;
* :mod:`~squall.training.algorithms`: the :class:`Algorithm` interface, ``local``, and all-reduce
  SGD / local SGD over any reducer (:mod:`squall.protocols.catalog` builds algorithms by name);
* :mod:`~squall.training.compress`: compressors (encode to a wire payload, decode, guarantees);
* :mod:`~squall.training.declaration`: what a protocol folder declares about itself;
* :mod:`~squall.training.optim`: SGD with momentum / weight decay, learning-rate schedules;
* :mod:`~squall.training.fingerprint`: parameter hash, norm and random projection;
* :mod:`~squall.training.vote`: agreement on when to stop;
* :mod:`~squall.training.config`: a training job's JSON configuration.
"""

from __future__ import annotations

from squall.training.algorithms import Algorithm
from squall.training.device import DeviceModel
from squall.training.fingerprint import Fingerprint, Projector, param_hash
from squall.training.loop import LoopConfig, Target, TrainResult, train
from squall.training.optim import LrSchedule, Sgd, SgdConfig
from squall.training.tasks import Sharding, Task, make_task
from squall.training.vote import TransportVote, Vote

__all__ = [
    "Algorithm",
    "DeviceModel",
    "Fingerprint",
    "LoopConfig",
    "LrSchedule",
    "Projector",
    "Sgd",
    "SgdConfig",
    "Sharding",
    "Target",
    "Task",
    "TrainResult",
    "TransportVote",
    "Vote",
    "make_task",
    "param_hash",
    "train",
]
