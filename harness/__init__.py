"""The network-emulation harness: profiles, link shaping, Docker clusters, checks and the pytest plugin."""
