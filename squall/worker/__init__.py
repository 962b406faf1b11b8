"""The worker side's process layer: the agent in each container, the job process, job names."""
