"""Low-bit all-reduce SGD: gradients averaged by Flash Communication's two-step INT8/INT4 all-reduce
(``lowbit_allreduce``), or by its control, the ring that requantizes at every hop (``lowbit_ring``).

The all-reduce is the shared one (:func:`squall.collectives.allreduce` with a
:class:`~squall.training.compress.GroupQuant` compressor, by the ``"two_step"`` or ``"ring"``
schedule); this folder declares both protocols and builds the training algorithm (:mod:`.sgd`):
all-reduce SGD over a low-bit reducer.
"""
