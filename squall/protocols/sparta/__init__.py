"""SPARTA ("Improving the Efficiency of Distributed Training using Sparse Parameter Averaging", Beton,
Baioumy, van der Ouderaa, Reed, Howes, Cheema, Vrabie, 2025; openreview stFPf3gzq1), as ExoGym and
the first author's diloco-sim implement it.

What it follows: after every local optimiser step, a fraction ``p`` of the parameters, the same on
every replica, is averaged over all replicas and written back; the parameters (not gradients) are
averaged, the local optimiser state is never touched, and every replica takes part in every
average (a global all-reduce, not gossip). The default ``p`` is 0.5 % (ExoGym's); the paper's
abstract uses about 0.05 %.

Where it departs:

* the subset is drawn by a generator seeded by the run's ``seed`` option and the step, the same on
  every replica, so no mask or index is sent (ExoGym broadcasts the whole boolean mask every step,
  which costs more than the payload); it is ``round(p P)`` positions drawn *with* replacement from
  all ``P`` parameters (a position drawn twice is averaged twice, to the same value), where the
  reference draws an independent Bernoulli(p) mask per tensor: the same expected coverage,
  ``1 - (1 - p)^t`` after ``t`` steps, with a fixed payload size;
* the whole subset is one ring all-reduce (:class:`squall.lowcomm.Averager`), not two collectives
  per tensor: one ``2 (n-1)`` latency per step instead of that times the tensor count;
* the average is applied in the same step (no asynchronous delay) and there is no DiLoCo outer
  step on top (ExoGym's SPARTA-DiLoCo); the inner optimiser is AdamW by default.
"""
