"""Errors raised by the NFQUEUE shaping backend."""

from __future__ import annotations


class NfqueueError(Exception):
    """Base class of every error this package raises."""


class ConfigError(NfqueueError, ValueError):
    """A link, queue or daemon configuration is invalid; the message says why."""


class NetlinkError(NfqueueError, OSError):
    """The kernel answered a netlink request with an error (``errno`` holds its code)."""


class ControlError(NfqueueError):
    """The daemon refused a control command or the control socket failed."""


class DaemonDied(NfqueueError):
    """The daemon process is gone: shaped links now pass packets unshaped (``--queue-bypass``)."""


class RulesError(NfqueueError):
    """Installing or removing iptables rules inside a namespace failed."""
