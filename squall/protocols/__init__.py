"""The reference protocols: one folder each, declared by its ``protocol.py`` (found by :mod:`.catalog`).

A protocol folder imports only the worker-side layers (``squall.wire``, ``squall.transport``,
``squall.job``, ``squall.training``, ``squall.collectives``, ``squall.gossip``), never another
protocol folder and never the host side: the protocols do not know they are being tested.
"""
