"""DeMo, decoupled momentum optimisation (Peng, Quesnelle, Kingma, "DeMo: Decoupled Momentum Optimization",
arXiv 2411.19870, 2024), after the authors' ``demo.py``.

What it follows, per tensor and per step:

* decoupled weight decay ``theta <- theta (1 - lr wd)``, then the momentum ``delta <- beta delta +
  lr g``, which is each replica's own and never averaged;
* ``delta`` is cut into chunks (a 2-d tensor into ``c1 x c2`` tiles, ``c`` the largest divisor of
  the dimension that is at most ``chunk``, 64 by default; anything else into 1-d chunks), each
  chunk goes through an orthonormal DCT-II (separable in 2-d), and only the ``k`` largest
  coefficients of each chunk (by magnitude, 32 by default) are kept, as (index, value) pairs;
* what is kept is taken out of the momentum (``delta <- delta - IDCT(kept)``, error feedback);
* every replica's pairs are all-gathered, each coefficient averaged over the replicas that sent
  it, the inverse DCT gives ``U``, and every replica steps ``theta <- theta - lr sign(U)``.

Replicas never exchange parameters: they stay equal because they start equal and every one
decodes the same gathered bytes in the same order (ranks in order, sums in float32).

Where it departs:

* one all-gather per step of every tensor's pairs together (the reference runs two collectives per
  tensor, which multiplies the latency by twice the tensor count);
* indices are int32 (the reference sends int64; an index is below 4096 and fits 16 bits, which
  the wire cannot carry as an array type), values float32; the pairs travel as a validated
  compressed payload (``demo_dct``): a receiver rejects an index outside its chunk or a value that
  is not finite;
* no emulated payload (the run's ``payload`` is refused): the bytes are the task's own;
* no learning-rate schedule of its own and no gradient clipping (the run's ``lr_schedule`` applies).
"""
