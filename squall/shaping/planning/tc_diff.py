"""From the tc operations a node has to the ones it should have: the steps in between (pure).

A change of link settings should not rebuild the tree: deleting a netem qdisc drops the packets it
holds (a burst of loss for every TCP flow on the link), and a rebuild costs several round trips.
So operations are compared by identity (:func:`key`):

* same identity, same value: nothing;
* same identity, new value, same structure (a qdisc of the same kind and handle, a class with
  the same parent): ``change`` (netem and HTB take the whole new spec and keep queued packets);
* identity only in the new plan: ``add``; only in the old: ``delete``.

A root or ingress qdisc (or an IFB device) that goes takes its classes, leaves and filters with it,
so only the top is deleted. Structural changes a kernel cannot ``change`` (a class that moves under
a new uplink class, a qdisc of another kind in the same place) rebuild that one device: tear it
down, add everything again.

Order: removals first (main devices, then IFB devices: nothing may still redirect to an IFB that
goes away), then additions and changes (IFB devices first, so the redirect finds its target).
Within a device, removals run in reverse creation order (a filter before its class) and
additions in creation order (a class before its leaf and filter).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from squall.shaping.planning.ops import (
    INGRESS_HANDLE,
    TC_H_INGRESS,
    TC_H_ROOT,
    ClassOp,
    DeviceOp,
    FilterOp,
    QdiscOp,
    TcOp,
)

Verb = Literal["add", "change", "delete"]
Key = tuple[object, ...]


@dataclass(frozen=True)
class TcStep:
    """One netlink request: what to do with which operation."""

    verb: Verb  # add, change or delete
    op: TcOp  # the operation (for delete, the one that created it)


def key(op: TcOp) -> Key:
    """Identity of an operation: two ops with the same key address the same kernel object."""
    if isinstance(op, DeviceOp):
        return ("device", op.name)
    if isinstance(op, QdiscOp):
        return ("qdisc", op.device, op.parent)
    if isinstance(op, ClassOp):
        return ("class", op.device, op.classid)
    return ("filter", op.device, op.parent, op.prio)


def device_of(op: TcOp) -> str:
    """The interface an operation belongs to (a DeviceOp belongs to the device it creates)."""
    return op.name if isinstance(op, DeviceOp) else op.device


def teardown(ops: Sequence[TcOp]) -> list[TcStep]:
    """Steps that remove everything ``ops`` created: root and ingress qdiscs (and with them classes,
    leaves and filters), then created devices."""
    steps = [
        TcStep("delete", op)
        for op in ops
        if isinstance(op, QdiscOp) and op.parent in (TC_H_ROOT, TC_H_INGRESS) and not _on_created_device(op, ops)
    ]
    steps += [TcStep("delete", op) for op in ops if isinstance(op, DeviceOp)]
    return steps


def _on_created_device(op: QdiscOp, ops: Sequence[TcOp]) -> bool:
    """Qdiscs on a device we create go away with the device."""
    return any(isinstance(o, DeviceOp) and o.name == op.device for o in ops)


def diff(old: Sequence[TcOp], new: Sequence[TcOp]) -> list[TcStep]:
    """The steps that turn a namespace holding ``old`` into one holding ``new``."""
    if tuple(old) == tuple(new):
        return []
    if not new:
        return teardown(old)
    created = {op.name for op in (*old, *new) if isinstance(op, DeviceOp)}
    devices = list(dict.fromkeys(device_of(op) for op in (*old, *new)))
    removals: list[TcStep] = []
    additions: dict[str, list[TcStep]] = {}
    for device in [d for d in devices if d not in created] + [d for d in devices if d in created]:
        before = [op for op in old if device_of(op) == device]
        after = [op for op in new if device_of(op) == device]
        if before == after:
            continue
        if _compatible(before, after):
            removals += _removals(before, after)
            additions[device] = _additions(before, after)
        else:
            removals += teardown(before)
            additions[device] = [TcStep("add", op) for op in after]
    order = [d for d in additions if d in created] + [d for d in additions if d not in created]
    return removals + [step for device in order for step in additions[device]]


def _compatible(before: Sequence[TcOp], after: Sequence[TcOp]) -> bool:
    """Whether ``after`` can be reached from ``before`` by adding, changing and deleting objects."""
    old = {key(op): op for op in before}
    for op in after:
        prev = old.get(key(op))
        if prev is None or prev == op:
            continue
        if isinstance(op, QdiscOp) and isinstance(prev, QdiscOp):
            if prev.handle != op.handle or type(prev.qdisc) is not type(op.qdisc):
                return False
        elif isinstance(op, ClassOp) and isinstance(prev, ClassOp):
            if prev.parent != op.parent:
                return False
        else:  # filters and devices never change in place
            return False
    return True


def _tree(op: TcOp) -> str:
    """Which top-level object an operation hangs from: the device, its ingress qdisc or its root qdisc."""
    if isinstance(op, DeviceOp):
        return "device"
    if (isinstance(op, QdiscOp) and op.parent == TC_H_INGRESS) or (
        isinstance(op, FilterOp) and op.parent == INGRESS_HANDLE
    ):
        return "ingress"
    return "root"


def _removals(before: Sequence[TcOp], after: Sequence[TcOp]) -> list[TcStep]:
    """Deletions, skipping what goes with something else that is deleted (subtree, leaf, device)."""
    keep = {key(op) for op in after}
    gone = [op for op in before if key(op) not in keep]
    gone_tops = {_tree(op) for op in gone if isinstance(op, DeviceOp) or _is_top(op)}
    gone_classes = {op.classid for op in gone if isinstance(op, ClassOp)}
    steps = []
    for op in reversed(gone):
        if "device" in gone_tops and not isinstance(op, DeviceOp):
            continue  # everything on a deleted device goes with it
        if _tree(op) in gone_tops and not _is_top(op) and not isinstance(op, DeviceOp):
            continue  # classes, leaves and filters go with their root or ingress qdisc
        if isinstance(op, QdiscOp) and op.parent in gone_classes:
            continue  # a leaf goes with its class
        steps.append(TcStep("delete", op))
    return steps


def _is_top(op: TcOp) -> bool:
    return isinstance(op, QdiscOp) and op.parent in (TC_H_ROOT, TC_H_INGRESS)


def _additions(before: Sequence[TcOp], after: Sequence[TcOp]) -> list[TcStep]:
    old = {key(op): op for op in before}
    steps = []
    for op in after:
        prev = old.get(key(op))
        if prev is None:
            steps.append(TcStep("add", op))
        elif prev != op:
            steps.append(TcStep("change", op))
    return steps
