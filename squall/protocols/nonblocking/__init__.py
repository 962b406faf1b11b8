"""Non-blocking SGD (He & Dube, arXiv 2211.00889): each worker accumulates micro-batches of its batch until
the fastest worker has finished all of them, then everyone synchronises with what it has finished
(ring all-reduce weighted by micro-batch counts, or a local step then D-PSGD / MATCHA mixing); the
micro-batches left over are computed first in the next iteration, so no sample is lost or repeated.

Modules: :mod:`.options` (the job's ``algorithm_args``), :mod:`.signals` (the "finished" signal),
:mod:`.ledger` (samples per epoch), :mod:`.sync` (the synchronisations), :mod:`.trainer` (the
lock-step loop), :mod:`.job` (the entry point), :mod:`.protocol` (the declarations).
"""
