"""A user's own program run in the shaped containers, judged like a protocol.

A program is a command (``python train.py``), not a Squall protocol: one rank per worker container,
started by the container's agent with the environment torchrun would give it. Squall observes it
from outside: its stdout lines (figures read by pattern, or records written by :func:`squall.log`),
its exit codes, and the bytes each directed link carried, counted in the kernel by the shaping
backend.

Modules: ``lines`` (pure, also used in the containers: metric patterns and ``squall.log`` lines),
``spec`` (what to run, validated), ``target`` (``loss<=1.2``), ``outcome`` (per-rank results and the
kernel's byte counts, as plain data), ``verdict`` (pass, fail or unknown) and ``result`` (the
``--json`` object).
"""
