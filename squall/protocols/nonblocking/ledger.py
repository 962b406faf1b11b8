"""Samples per epoch: a counting wrapper around a rank's micro-batch stream.

Non-blocking SGD leaves the micro-batches a worker did not start in its stream, for the next
iteration; :func:`squall.training.microbatch.accumulate` takes a micro-batch from the stream only
when it computes it whole. So every micro-batch :class:`SampleLedger` hands out is computed exactly
once, and the ledger's counts are the samples trained on. The task's stream reshuffles the shard
every epoch and drops its last partial batch (``SupervisedTask.batches``): an epoch is
``shard // microbatch_size`` micro-batches (one when the shard is smaller than a micro-batch).
"""

from __future__ import annotations

from collections.abc import Iterator

from squall.training.tasks.base import Batch


class SampleLedger(Iterator[Batch]):
    """The stream ``batches``, counted: micro-batches and samples in total and in the current epoch.

    :param per_epoch: micro-batches in one epoch of this rank's stream (None: no epoch accounting,
        for a task whose stream has no epochs).
    """

    def __init__(self, batches: Iterator[Batch], per_epoch: int | None = None) -> None:
        if per_epoch is not None and per_epoch < 1:
            raise ValueError(f"per_epoch must be >= 1 micro-batches, got {per_epoch}")
        self.batches, self.per_epoch = batches, per_epoch
        self.taken = 0  # micro-batches handed out
        self.samples = 0  # samples in them
        self.epoch_samples = 0  # samples handed out in the current epoch
        self.completed: list[int] = []  # samples of each finished epoch

    @property
    def epoch(self) -> int:
        """The current epoch (0-based)."""
        return len(self.completed)

    def __next__(self) -> Batch:
        batch = next(self.batches)
        n = int(batch[1].shape[0])
        self.taken += 1
        self.samples += n
        self.epoch_samples += n
        if self.per_epoch is not None and self.taken % self.per_epoch == 0:
            self.completed.append(self.epoch_samples)
            self.epoch_samples = 0
        return batch


def microbatches_per_epoch(shard_size: int, microbatch_size: int) -> int:
    """Micro-batches in one epoch of a shard of ``shard_size`` samples (the task's stream drops the rest)."""
    if shard_size < 1 or microbatch_size < 1:
        raise ValueError(f"shard_size and microbatch_size must be >= 1, got {shard_size}, {microbatch_size}")
    return max(1, shard_size // microbatch_size)
