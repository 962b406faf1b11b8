"""Hosts in plain namespaces for tests and benchmarks (root): veth pairs, a bridged LAN, a UDP echo probe."""
