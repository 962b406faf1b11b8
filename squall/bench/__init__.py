"""Benchmark jobs that run inside the containers (the host side is benchmarks/)."""
