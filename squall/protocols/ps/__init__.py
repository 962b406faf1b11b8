"""Sharded parameter server: workers push gradient ranges, servers average and update, workers pull.

* :mod:`~squall.protocols.ps.sharding`: pure layout (who serves which range, who computes) and cost model;
* :mod:`~squall.protocols.ps.server`: :class:`ServerShard`, a shard's parameters and SGD state;
* :mod:`~squall.protocols.ps.step`: :func:`ps_step`, one synchronous step over a transport.
"""

from __future__ import annotations

from squall.protocols.ps.server import ServerShard, SGDConfig
from squall.protocols.ps.sharding import PSLayout, ps_time
from squall.protocols.ps.step import PS_PULL_TAG, PS_PUSH_TAG, ps_step

__all__ = ["PS_PULL_TAG", "PS_PUSH_TAG", "PSLayout", "SGDConfig", "ServerShard", "ps_step", "ps_time"]
