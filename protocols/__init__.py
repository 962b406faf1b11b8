"""Reference implementations of decentralized and communication-efficient training protocols.

Nothing in this package imports :mod:`harness`, docker, pyroute2 or pytest: the protocols
never know they are being tested (see DESIGN.md, section 1).
"""
