"""The job agent's commands: what the host may ask the agent in each container, one member each.

A request is ``{"cmd": <member's string>, ...fields}`` (:mod:`squall.worker.jsonline` frames it);
the agent (:mod:`squall.worker.agent`) dispatches through a table with one handler per member and
answers an unknown command with the list of known ones (:func:`command_of`). The strings are what
travel and what the logs show; both sides import this module, so they change together.

Plain stdlib, so the host's agent client and the swarm's node agent import it too.
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import StrEnum
from typing import Any, TypeVar

# Files in a worker's run directory, written by one side and read by the other while the agent is a
# fork of the run's fork server (squall.worker.standin reads them, the host and the fork server write).
PID_FILE = "agent.pid"  # the forked agent's pid in its container's namespace, written before it serves
FALLBACK_FILE = "agent.fallback"  # written by the host: no fork came, the stand-in becomes the agent
EXIT_FILE = "agent.exit"  # the forked agent's exit code, written as it ends


class AgentCommand(StrEnum):
    """What the host asks a container's agent; each comment is the agent's answer in its own words."""

    PING = "ping"  # "I am up: here are my pid, the modules I preloaded and how many jobs are running."
    RUN = "run"  # "I forked a child for this job spec and it runs now: here are its job id and pid."
    WAIT = "wait"  # "I answer when this job ends, or when your timeout passes with it still running."
    CANCEL = "cancel"  # "I killed this job's process group (and what it started) and say how it ended."
    SHUTDOWN = "shutdown"  # "I stop: every job killed, my socket removed, then I exit."

    def request(self, **fields: Any) -> dict[str, Any]:
        """This command as a request object with ``fields``."""
        return {"cmd": self.value, **fields}


Command = TypeVar("Command", bound=StrEnum)


class UnknownCommand(ValueError):
    """A request whose ``cmd`` is missing or not a member of the protocol's commands."""


def known(commands: type[StrEnum]) -> str:
    """The commands' strings, comma-separated, for an error that says what is allowed."""
    return ", ".join(member.value for member in commands)


def command_of(commands: type[Command], request: Mapping[str, Any]) -> Command:
    """The member of ``commands`` that ``request["cmd"]`` names; :class:`UnknownCommand` naming the
    known ones otherwise."""
    cmd = request.get("cmd")
    if not isinstance(cmd, str):
        raise UnknownCommand(f"a request needs a string 'cmd', got {cmd!r}; known: {known(commands)}")
    try:
        return commands(cmd)
    except ValueError:
        raise UnknownCommand(f"unknown command {cmd!r}; known: {known(commands)}") from None
