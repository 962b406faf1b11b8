"""The netem backend: HTB, u32 and netem qdiscs in each container's namespace."""
