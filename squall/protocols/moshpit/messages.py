"""Moshpit's control messages: what each says, how it is built and checked.

Every control message is a JSON object ``{"op": <Op>, ...}`` on :data:`CONTROL_TAG`, with the
round it concerns in the header. Tensors travel on other tags: a group's all-reduce on its
group id (:func:`data_tag`), a joiner's state download on :data:`STATE_TAG`. A malformed control
message raises :class:`BadMessage` and is dropped by the receiver (logged), never trusted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from enum import IntEnum
from typing import Any

from squall.protocols.moshpit.membership import Heartbeat
from squall.wire import JsonValue, Message

CONTROL_TAG = 0x4D534850  # "MSHP"
STATE_TAG = 0x4D535354  # "MSST"
#: Group ids are drawn in ``range(1, GROUP_ID_LIMIT)``: a group's copies travel on tag ``gid``, its means
#: on ``gid | MEAN_BIT``; both stay below the fixed tags above (which are > 2**30).
GROUP_ID_LIMIT = 1 << 29
MEAN_BIT = 1 << 29


class Op(IntEnum):
    """Control operations, each in the sender's voice."""

    HEARTBEAT = 1  # "I am alive, in this cell, at this round."
    JOIN = 2  # "You lead my group this round: take me in, with this weight."
    GROUP = 3  # "The group is closed: these members, these weights, this id. Start."
    REJECT = 4  # "Not with me this round" (reason: closed, or I am not the leader)
    LEAVE = 5  # "I am going; do not wait for me."
    STATE_REQUEST = 6  # "I just joined: send me your parameters."
    EXCLUDED = 7  # "Your piece of my shard did not arrive in time: keep your own values."


class BadMessage(ValueError):
    """A control message that does not say what its op requires."""


def control(op: Op, round: int, **fields: JsonValue) -> Message:
    """A control message of ``op`` about ``round``."""
    return Message.of_control({"op": int(op), **fields}, round=round, tag=CONTROL_TAG)


def op_of(message: Message) -> Op:
    """The op of a received control message."""
    body = message.control or {}
    try:
        return Op(_int(body, "op"))
    except ValueError as exc:
        raise BadMessage(f"unknown op in {dict(body)!r}") from exc


def heartbeat(beat: Heartbeat, round: int) -> Message:
    """A ``HEARTBEAT``."""
    return control(
        Op.HEARTBEAT,
        round,
        inc=beat.incarnation,
        cell=beat.cell,
        reached=beat.reached,
        step=beat.step,
        age=round_age(beat.age),
    )


def round_age(age: float) -> float:
    """An age as sent: milliseconds are plenty."""
    return float(f"{age:.3f}")


def parse_heartbeat(message: Message) -> Heartbeat:
    """The :class:`Heartbeat` of a ``HEARTBEAT`` message."""
    body = message.control or {}
    cell = body.get("cell")
    if cell is not None and (isinstance(cell, bool) or not isinstance(cell, int) or cell < 0):
        raise BadMessage(f"bad cell {cell!r}")
    step = _int(body, "step")
    return Heartbeat(_int(body, "inc"), cell, message.round, bool(body.get("reached")), step, _nonneg(body, "age"))


@dataclass(frozen=True, slots=True)
class Join:
    """A ``JOIN`` request."""

    key: tuple[int, ...]  # the sender's group key, as GroupKey.to_json()
    weight: float  # the sender's averaging weight
    bandwidth: float | None  # the sender's declared bandwidth (None: unknown)


def join(key: list[int], weight: float, bandwidth: float | None, round: int) -> Message:
    """A ``JOIN`` for ``round``."""
    return control(Op.JOIN, round, key=list(key), weight=weight, bandwidth=bandwidth)


def parse_join(message: Message) -> Join:
    """The :class:`Join` of a ``JOIN`` message."""
    body = message.control or {}
    key = body.get("key")
    if not isinstance(key, list) or not all(isinstance(k, int) and not isinstance(k, bool) for k in key):
        raise BadMessage(f"bad key {key!r}")
    bandwidth = body.get("bandwidth")
    declared = None if bandwidth is None else _pos(bandwidth)
    return Join(tuple(k for k in key if isinstance(k, int)), _nonneg(body, "weight"), declared)


@dataclass(frozen=True, slots=True)
class GroupInfo:
    """An assembled group, as its leader announced it."""

    group_id: int  # unique per group, drawn by the leader; the tag of its copies (means: | MEAN_BIT)
    round: int  # the round it averages in
    members: tuple[int, ...]  # ranks, ascending: member i owns shard i
    weights: tuple[float, ...]  # each member's averaging weight
    fractions: tuple[float, ...]  # each member's share of the vector
    leader: int  # who assembled it

    @property
    def copy_tag(self) -> int:
        """Tag of the members' copies of a shard, sent to its owner."""
        return self.group_id

    @property
    def mean_tag(self) -> int:
        """Tag of an owner's mean (or exclusion notice), sent back to the members."""
        return self.group_id | MEAN_BIT

    def index(self, rank: int) -> int:
        """Position of ``rank`` among the members (its shard)."""
        return self.members.index(rank)


def group(info: GroupInfo) -> Message:
    """A ``GROUP`` announcement."""
    return control(
        Op.GROUP,
        info.round,
        gid=info.group_id,
        members=list(info.members),
        weights=list(info.weights),
        fractions=list(info.fractions),
    )


def parse_group(message: Message) -> GroupInfo:
    """The :class:`GroupInfo` of a ``GROUP`` message (checked for consistency)."""
    body = message.control or {}
    members = _int_list(body, "members")
    weights = _float_list(body, "weights")
    fractions = _float_list(body, "fractions")
    if not members or len(set(members)) != len(members) or list(members) != sorted(members):
        raise BadMessage(f"members must be distinct ranks in ascending order, got {members}")
    if not len(members) == len(weights) == len(fractions):
        raise BadMessage("members, weights and fractions differ in length")
    if message.sender is None or message.sender not in members:
        raise BadMessage(f"leader {message.sender} is not a member of its group {members}")
    gid = _int(body, "gid")
    if not 0 < gid < GROUP_ID_LIMIT:
        raise BadMessage(f"group id {gid} out of range")
    return GroupInfo(gid, message.round, tuple(members), tuple(weights), tuple(fractions), message.sender)


def excluded(info: GroupInfo, *, as_owner: bool) -> Message:
    """An ``EXCLUDED`` notice in place of a copy (``as_owner=False``) or of a mean (``as_owner=True``)."""
    return Message.of_control(
        {"op": int(Op.EXCLUDED)}, round=info.round, tag=info.mean_tag if as_owner else info.copy_tag
    )


def reject(round: int, reason: str) -> Message:
    """A ``REJECT`` saying why."""
    return control(Op.REJECT, round, reason=reason)


def reject_reason(message: Message) -> str:
    """``"closed"`` or ``"not_leader"``."""
    reason = (message.control or {}).get("reason")
    if reason not in ("closed", "not_leader"):
        raise BadMessage(f"bad reject reason {reason!r}")
    return str(reason)


def _int(body: Mapping[str, Any], key: str) -> int:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int):
        raise BadMessage(f"field {key!r} must be an integer, got {value!r}")
    return value


def _nonneg(body: Mapping[str, Any], key: str) -> float:
    value = body.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise BadMessage(f"field {key!r} must be a number >= 0, got {value!r}")
    return float(value)


def _pos(value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float) or value <= 0:
        raise BadMessage(f"bandwidth must be a number > 0, got {value!r}")
    return float(value)


def _int_list(body: Mapping[str, Any], key: str) -> list[int]:
    value = body.get(key)
    if not isinstance(value, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in value):
        raise BadMessage(f"field {key!r} must be a list of integers, got {value!r}")
    return [int(v) for v in value]


def _float_list(body: Mapping[str, Any], key: str) -> list[float]:
    value = body.get(key)
    if not isinstance(value, list) or not all(
        isinstance(v, int | float) and not isinstance(v, bool) and v >= 0 for v in value
    ):
        raise BadMessage(f"field {key!r} must be a list of numbers >= 0, got {value!r}")
    return [float(v) for v in value]
