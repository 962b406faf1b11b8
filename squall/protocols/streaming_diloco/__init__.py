"""Streaming DiLoCo (Douillard et al., "Streaming DiLoCo with overlapping communication: towards a
distributed free lunch", arXiv 2501.18512, 2025).

What it follows (the paper's Algorithm 2 and sections 2.2-2.4):

* the model is split into ``F`` fragments of transformer blocks, *strided* by default (fragment ``p``
  holds blocks ``p, p + F, p + 2F ...``), and each fragment is synchronised every ``H`` steps on
  its own staggered schedule: fragment ``p`` at steps ``t_p + H, t_p + 2H ...`` with ``t_p = p H/F``
  (so one fragment every ``H/F`` steps, and the peak bandwidth is about ``1/F`` of DiLoCo's);
* at its step, a fragment's outer gradient ``theta_p - theta_{i,p}`` is sent quantized to FP4 E3M0
  (:class:`squall.training.compress.Fp4E3M0`) and averaged, the sum taken in float32; training
  goes on meanwhile (the averaging runs beside the next steps);
* ``tau`` inner steps later (``overlap``) the average is awaited, the fragment's outer Nesterov
  step gives ``theta~_p``, and the replica merges ``theta_{i,p} <- alpha theta_{i,p} + (1 - alpha)
  theta~_p`` (``alpha`` 0.5 by default, the paper's): the ``tau`` local steps are kept half-way;
* each fragment has its own outer momentum; the defaults are the paper's where it gives one
  (``H`` 100, ``tau`` 1, ``alpha`` 0.5, outer lr 0.4) and DiLoCo's 0.9 for the outer momentum,
  which the paper does not state.

Where it departs:

* the paper does not say how FP4 values are scaled and rounded: here, an absmax float32 scale per
  group of 128 and round-to-nearest (see :mod:`squall.training.compress.fp4`); the average is the
  two-step exchange :func:`squall.collectives.allreduce` runs for payloads that do not add (each
  element quantized twice: the replica's outer gradient, then the owner's float32 mean before it
  goes back);
* blocks are found by their names (``h<i>.``, as the ``tinylm`` task names them); tensors before
  the first block (embeddings) belong to fragment 0 and those after the last (final norm) to
  fragment ``F - 1``; a task that names no blocks is cut into ``F`` contiguous, nearly equal ranges;
* the overlap uses the training loop's event loop: a fragment's messages move while the loop
  waits out a step's emulated compute time and while it waits for the network, not while the CPU
  computes (a GPU's copy engines would run beside its compute);
* when training stops, every fragment takes one last outer step (``sync_at_end``), so the final
  model is the global one (the paper evaluates the global parameters too);
* no QK-norm or z-loss in the model.
"""
