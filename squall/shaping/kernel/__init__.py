"""Talking to the kernel from the host: namespaces, netlink, tc, iptables and nftables; a plan applied to every node."""
