"""The ``swarm`` engine: workers as a Docker Swarm service, shaped by a node agent on every node.

Modules: ``membership`` (joining or initialising the swarm, and leaving what Squall initialised),
``wire`` (the authenticated JSON protocol between the harness and the node agents, and the
LinkState codec), ``node_agent`` (the agent: runs in the ``squall-node-agent`` global service),
``agent_image`` (its image), ``remote`` (the harness side: clients of the agents, the relay to the
workers' job agents, and the shaper that splits the plan per node) and ``cluster``
(:class:`~squall.cluster.swarm.cluster.SwarmCluster`). See docs/swarm.md.
"""
