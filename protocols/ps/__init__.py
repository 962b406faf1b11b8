"""Sharded parameter server: workers push gradient ranges, servers average and update, workers pull.

* :mod:`~protocols.ps.sharding`: pure layout (who serves which range, who computes) and cost model;
* :mod:`~protocols.ps.server`: :class:`ServerShard`, a shard's parameters and SGD state;
* :mod:`~protocols.ps.step`: :func:`ps_step`, one synchronous step over a transport.
"""

from __future__ import annotations

from protocols.ps.server import ServerShard, SGDConfig
from protocols.ps.sharding import PSLayout, ps_time
from protocols.ps.step import PS_PULL_TAG, PS_PUSH_TAG, ps_step

__all__ = ["PS_PULL_TAG", "PS_PUSH_TAG", "PSLayout", "SGDConfig", "ServerShard", "ps_step", "ps_time"]
