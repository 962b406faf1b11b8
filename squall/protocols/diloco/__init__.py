"""DiLoCo (Douillard et al., "DiLoCo: Distributed Low-Communication Training of Language Models", 2023),
and the DDP baseline it is measured against.

What it follows (the paper's Algorithm 1, and torchft's and OpenDiLoCo's implementations):

* every replica starts from the same parameters (the run's seed) and keeps a copy of the global
  parameters ``theta``;
* ``H`` inner steps of AdamW on its own shard (``sync_every``; the inner AdamW state is the
  replica's own, never reset and never averaged);
* the pseudo-gradient ``delta_i = theta - theta_i`` (old global minus local: the sign torchft got
  wrong at first, pitfall (a)) is averaged over all replicas, the only communication;
* the outer optimiser, SGD with Nesterov momentum (lr 0.7, momentum 0.9 by default, the paper's),
  steps ``theta`` with the averaged ``delta`` as its gradient; every replica holds the same outer
  state, so ``theta`` stays identical everywhere, and the replica restarts from it.

Where it departs:

* the pseudo-gradient is averaged by one ring all-reduce of the whole flat vector (bucketed, not
  one collective per tensor: pitfall (f)), through :class:`squall.lowcomm.Averager`, which can
  round it to bf16/fp16 (OpenDiLoCo's fp16 all-reduce), pad it to an emulated model's size and
  compress it with any compressor of :mod:`squall.training.compress` (off by default);
* no warm-up phase of plain data-parallel training before DiLoCo starts (the paper's 24 k
  pre-training steps), and no inner learning-rate warm-up of its own: the run's ``lr_schedule``
  applies to the inner steps;
* with a budget that is not a multiple of ``H``, a last outer step on the partial round is taken
  when training stops (``sync_at_end``), so the final model is a global one;
* the evaluations the loop makes between outer steps score the replica's local parameters; right
  after an outer step (``eval_every`` a multiple of ``H``) they are the global ones.

``ddp_adamw`` (the baseline): the gradient averaged every step through the same seam, AdamW on the
average (the data-parallel baseline of the papers, not SGD).
"""
