"""The run's iptables rules in one container namespace: DROP (cut links) and TEE (duplicates).

Two chains per run in the ``mangle`` table, each entered by one jump at the top of its hook::

    SQUALL-<run>-in   from PREROUTING:  -s <src> -j DROP
    SQUALL-<run>-out  from POSTROUTING: -d <dst> -m statistic --mode random --probability p -j TEE --gateway <dst>

Both backends use them (a backend's own rules elsewhere, such as the nfqueue backend's hold chain
on the bridge, are its own). The set changes at run time (links cut and healed, duplication
switched on and off) and must change atomically and fast, so every change is one
``iptables-restore --noflush`` transaction per namespace: declaring a user chain flushes it, the
new rules follow, and the jumps are touched only when the chains appear or go. A namespace is left
exactly as found, ``iptables-save`` prints the same before and after: the ``iptables-save``
helpers here (normalisation, table checks) tell whether the run's chains created the ``mangle``
table, and :mod:`squall.shaping.kernel.nft_table` deletes that table again (iptables-nft cannot).

Commands run in the thread that entered the namespace (:mod:`squall.shaping.kernel.netns`), so no ``nsenter``.
"""

from __future__ import annotations

import re
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass

from squall.shaping.base import ShapingError
from squall.shaping.kernel.netns import Namespace, NamespaceGone
from squall.shaping.kernel.nft_table import delete_table
from squall.shaping.planning.ops import Hook, RuleOp

TABLE = "mangle"
MAX_CHAIN = 28  # XT_EXTENSION_MAXNAMELEN - 1
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_BASE_CHAIN = re.compile(r"^:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) ACCEPT \[0:0\]$")
SUFFIX: dict[Hook, str] = {"PREROUTING": "in", "POSTROUTING": "out"}


@dataclass(frozen=True)
class Chains:
    """The run's chain names."""

    run_id: str  # the run they belong to

    def __post_init__(self) -> None:
        longest = len(self.name("POSTROUTING"))
        if not _RUN_ID.match(self.run_id) or longest > MAX_CHAIN:
            raise ShapingError(
                f"run id {self.run_id!r}: need [A-Za-z0-9_.-] and at most {MAX_CHAIN - longest + len(self.run_id)} "
                "characters (iptables chain names)"
            )

    def name(self, hook: Hook) -> str:
        """The chain jumped to from ``hook``."""
        return f"SQUALL-{self.run_id}-{SUFFIX[hook]}"

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """The hooks, in the order of the chains in a script."""
        return ("PREROUTING", "POSTROUTING")


@dataclass(frozen=True)
class Installed:
    """What :func:`sync` left in one namespace, which the next call needs."""

    rules: tuple[RuleOp, ...]  # the rules in the chains now
    created_table: bool  # the mangle table did not exist before the chains


# ----------------------------------------------------------------------------- scripts (pure)


def rule_args(op: RuleOp) -> str:
    """The match and target of one rule, as ``iptables-restore`` reads them."""
    if op.action == "DROP":
        return f"-s {op.peer}/32 -j DROP"
    return f"-d {op.peer}/32 -m statistic --mode random --probability {op.probability:.10f} -j TEE --gateway {op.peer}"


def fill_script(chains: Chains, rules: Sequence[RuleOp], *, jumps: Sequence[Hook] = ()) -> str:
    """Declare (and so flush) both chains, append the rules, insert the given jumps."""
    lines = [f"*{TABLE}"]
    lines += [f":{chains.name(hook)} - [0:0]" for hook in chains.hooks]
    lines += [f"-A {chains.name(op.hook)} {rule_args(op)}" for op in rules]
    lines += [f"-I {hook} 1 -j {chains.name(hook)}" for hook in jumps]
    return "\n".join([*lines, "COMMIT", ""])


def remove_script(chains: Chains, jumps: Sequence[Hook]) -> str:
    """Flush both chains, remove the given jumps, delete the chains."""
    lines = [f"*{TABLE}"]
    lines += [f":{chains.name(hook)} - [0:0]" for hook in chains.hooks]
    lines += [f"-D {hook} -j {chains.name(hook)}" for hook in jumps]
    lines += [f"-X {chains.name(hook)}" for hook in chains.hooks]
    return "\n".join([*lines, "COMMIT", ""])


def present_jumps(save_text: str, chains: Chains) -> list[Hook]:
    """Hooks whose jump to the run's chain appears in a normalized ``iptables-save``."""
    lines = set(save_text.splitlines())
    return [hook for hook in chains.hooks if f"-A {hook} -j {chains.name(hook)}" in lines]


def has_chains(save_text: str, chains: Chains) -> bool:
    """Whether the run's chains are declared in a normalized ``iptables-save``."""
    return any(line.startswith(f":{chains.name(h)} ") for line in save_text.splitlines() for h in chains.hooks)


def normalize_save(text: str) -> str:
    """``iptables-save`` output without comments and with counters zeroed, for comparisons."""
    lines = []
    for line in text.splitlines():
        if not line or line.startswith("#"):
            continue
        lines.append(re.sub(r"\[\d+:\d+\]", "[0:0]", line))
    return "\n".join(lines)


def has_table(save_text: str, table: str = TABLE) -> bool:
    """Whether a full ``iptables-save`` lists ``table`` (``-t`` would print it even when absent)."""
    return f"*{table}" in save_text.splitlines()


def table_is_empty(save_text: str) -> bool:
    """Whether a normalized ``iptables-save -t mangle`` shows only base chains with ACCEPT policy."""
    body = [line for line in normalize_save(save_text).splitlines() if line not in ("*mangle", "COMMIT")]
    return all(_BASE_CHAIN.match(line) for line in body)


# ----------------------------------------------------------------------------- execution (in the namespace)


def _run(argv: list[str], stdin: str | None = None) -> str:
    proc = subprocess.run(argv, input=stdin, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise ShapingError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def _save(table: str | None = None) -> str:
    return normalize_save(_run(["iptables-save"] + (["-t", table] if table else [])))


def _restore(script: str) -> None:
    _run(["iptables-restore", "-w", "--noflush"], script)


def sync(
    namespace: Namespace, chains: Chains, before: Installed | None, rules: Sequence[RuleOp], node: int
) -> Installed | None:
    """Make the run's chains in ``namespace`` hold ``rules``; return what is installed (None: nothing).

    One ``iptables-restore`` transaction per call: the namespace sees the old rules or the new ones.
    """
    rules = tuple(rules)
    if before is not None and before.rules == rules:
        return before
    try:
        with namespace.entered():
            if not rules:
                if before is not None:
                    _remove_here(chains, before.created_table)
                return None
            if before is None:
                full = _save()
                created = not has_table(full, TABLE)
                missing = [h for h in chains.hooks if h not in present_jumps(full, chains)]
                _restore(fill_script(chains, rules, jumps=missing))
                return Installed(rules, created)
            _restore(fill_script(chains, rules))
            return Installed(rules, before.created_table)
    except NamespaceGone:
        raise
    except ShapingError as exc:
        raise ShapingError(f"node {node}: iptables: {exc}") from exc


def remove(namespace: Namespace, chains: Chains, installed: Installed | None, node: int) -> None:
    """Remove the run's chains and jumps (and the mangle table if they created it)."""
    if installed is None:
        return
    try:
        with namespace.entered():
            _remove_here(chains, installed.created_table)
    except NamespaceGone:
        raise
    except ShapingError as exc:
        raise ShapingError(f"node {node}: iptables: {exc}") from exc


def _remove_here(chains: Chains, created_table: bool) -> None:
    save = _save(TABLE)
    if has_chains(save, chains):
        _restore(remove_script(chains, present_jumps(save, chains)))
    if created_table and has_table(_save(), TABLE) and table_is_empty(_save(TABLE)):
        try:
            delete_table("/proc/thread-self/ns/net", TABLE)
        except OSError as exc:
            raise ShapingError(f"deleting the {TABLE} table: {exc}") from exc
