"""The run's iptables rules in one container namespace: cut links, duplicates and NAT.

Chains per run, each entered by one jump at the top of its hook::

    mangle SQUALL-<run>-in   from PREROUTING:  -s <src> -j DROP                             a cut link
                                               -s <src> -m conntrack --ctstate NEW -j DROP    behind a NAT
    mangle SQUALL-<run>-out  from POSTROUTING: -d <dst> -m statistic --mode random --probability p
                                                  -j TEE --gateway <dst>                    duplicates
                                               -d <nat address> -j DROP                     no NAT mapping
    nat    SQUALL-<run>-nat  from INPUT:       -s <src> -j SNAT --to-source <nat address>   src behind NAT

Both backends use them (a backend's own rules elsewhere, such as the nfqueue backend's hold chain
on the bridge, are its own). The ``nat`` chain exists only in a namespace that needs it, so a run
without NAT never registers the nat table's hooks. The set changes at run time (links cut and
healed, duplication switched on and off) and must change atomically and fast, so every change is
one ``iptables-restore --noflush`` transaction per namespace: declaring a user chain flushes it,
the new rules follow, and the jumps are touched only when the chains appear or go. A namespace is
left exactly as found, ``iptables-save`` prints the same before and after: the ``iptables-save``
helpers here (normalisation, table checks) tell whether the run's chains created a table, and
:mod:`squall.shaping.kernel.nft_table` deletes that table again (iptables-nft cannot).

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
TABLES = ("mangle", "nat")  # in the order a script writes them
TABLE_OF: dict[Hook, str] = {"PREROUTING": "mangle", "POSTROUTING": "mangle", "INPUT": "nat"}
MAX_CHAIN = 28  # XT_EXTENSION_MAXNAMELEN - 1
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]+$")
_BASE_CHAIN = re.compile(r"^:(PREROUTING|INPUT|FORWARD|OUTPUT|POSTROUTING) ACCEPT \[0:0\]$")
SUFFIX: dict[Hook, str] = {"PREROUTING": "in", "POSTROUTING": "out", "INPUT": "nat"}


@dataclass(frozen=True)
class Chains:
    """The run's chain names in one table."""

    run_id: str  # the run they belong to
    table: str = TABLE

    def __post_init__(self) -> None:
        longest = len(self.name("POSTROUTING"))
        if not _RUN_ID.match(self.run_id) or longest > MAX_CHAIN:
            raise ShapingError(
                f"run id {self.run_id!r}: need [A-Za-z0-9_.-] and at most {MAX_CHAIN - longest + len(self.run_id)} "
                "characters (iptables chain names)"
            )
        if self.table not in TABLES:
            raise ShapingError(f"table {self.table!r}: the run's chains are in {', '.join(TABLES)}")

    def name(self, hook: Hook) -> str:
        """The chain jumped to from ``hook``."""
        return f"SQUALL-{self.run_id}-{SUFFIX[hook]}"

    @property
    def hooks(self) -> tuple[Hook, ...]:
        """The hooks of this table, in the order of the chains in a script."""
        return tuple(hook for hook in SUFFIX if TABLE_OF[hook] == self.table)

    def other(self, table: str) -> Chains:
        """The run's chains in ``table``."""
        return Chains(self.run_id, table)


@dataclass(frozen=True)
class Installed:
    """What :func:`sync` left in one namespace, which the next call needs."""

    rules: tuple[RuleOp, ...]  # the rules in the chains now, every table
    created_table: bool  # the mangle table did not exist before the chains
    created_nat: bool = False  # the nat table did not exist before the run's nat chain

    def of(self, table: str) -> tuple[RuleOp, ...]:
        """The installed rules of ``table``."""
        return tuple(op for op in self.rules if TABLE_OF[op.hook] == table)

    def created(self, table: str) -> bool:
        """Whether the run's chain created ``table``."""
        return self.created_nat if table == "nat" else self.created_table


# ----------------------------------------------------------------------------- scripts (pure)


def rule_args(op: RuleOp) -> str:
    """The match and target of one rule, as ``iptables-restore`` reads them."""
    if op.action == "DROP":
        side = "-d" if op.hook == "POSTROUTING" else "-s"  # leaving: by destination; arriving: by source
        return f"{side} {op.peer}/32 -j DROP"
    if op.action == "DROP_NEW":
        return f"-s {op.peer}/32 -m conntrack --ctstate NEW -j DROP"
    if op.action == "SNAT":
        if op.to is None:
            raise ShapingError(f"SNAT of {op.peer} needs the address it is seen at")
        return f"-s {op.peer}/32 -j SNAT --to-source {op.to}"
    return f"-d {op.peer}/32 -m statistic --mode random --probability {op.probability:.10f} -j TEE --gateway {op.peer}"


def fill_script(chains: Chains, rules: Sequence[RuleOp], *, jumps: Sequence[Hook] = ()) -> str:
    """Declare (and so flush) the table's chains, append the rules, insert the given jumps."""
    lines = [f"*{chains.table}"]
    lines += [f":{chains.name(hook)} - [0:0]" for hook in chains.hooks]
    lines += [f"-A {chains.name(op.hook)} {rule_args(op)}" for op in rules]
    lines += [f"-I {hook} 1 -j {chains.name(hook)}" for hook in jumps]
    return "\n".join([*lines, "COMMIT", ""])


def remove_script(chains: Chains, jumps: Sequence[Hook]) -> str:
    """Flush the table's chains, remove the given jumps, delete the chains."""
    lines = [f"*{chains.table}"]
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


def table_is_empty(save_text: str, table: str = TABLE) -> bool:
    """Whether a normalized ``iptables-save -t <table>`` shows only base chains with ACCEPT policy."""
    body = [line for line in normalize_save(save_text).splitlines() if line not in (f"*{table}", "COMMIT")]
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

    One ``iptables-restore`` transaction per table and call: the namespace sees a table's old rules
    or its new ones. ``chains`` names the run's mangle chains; its nat chain comes and goes with the
    nat rules.
    """
    rules = tuple(rules)
    if before is not None and before.rules == rules:
        return before
    if before is None and not rules:
        return None  # nothing held, nothing wanted: not even an iptables-save
    try:
        with namespace.entered():
            adds_nat = any(TABLE_OF[r.hook] == "nat" for r in rules) and (before is None or not before.of("nat"))
            full = _save() if before is None or adds_nat else None
            created = {}
            for table in TABLES:
                mine = chains.other(table)
                wanted = tuple(r for r in rules if TABLE_OF[r.hook] == table)
                held = before.of(table) if before is not None else ()
                # the mangle chains stay while the run has any rule here, the nat chain while it has nat rules
                had = before is not None and (table == TABLE or bool(held))
                keep = bool(rules) if table == TABLE else bool(wanted)
                was_created = before.created(table) if before is not None else False
                created[table] = _sync_table(mine, (had, keep, was_created), held, wanted, full)
            if not rules:
                return None
            return Installed(rules, created[TABLE], created["nat"])
    except NamespaceGone:
        raise
    except ShapingError as exc:
        raise ShapingError(f"node {node}: iptables: {exc}") from exc


def _sync_table(chains: Chains, flags: tuple[bool, bool, bool], held: tuple[RuleOp, ...],
                wanted: tuple[RuleOp, ...], full: str | None) -> bool:
    """One table's part of :func:`sync`, in the namespace: whether the run's chains created the table.

    ``flags``: the run's chains are in the table now, they must be after this call, they created it.
    ``full``: an ``iptables-save`` taken before, wherever the chains are to appear.
    """
    had, keep, created = flags
    if not keep:
        if had:
            _remove_here(chains, created)
        return False
    if not had:
        assert full is not None
        missing = [h for h in chains.hooks if h not in present_jumps(full, chains)]
        _restore(fill_script(chains, wanted, jumps=missing))
        return not has_table(full, chains.table)
    if held != wanted:
        _restore(fill_script(chains, wanted))
    return created


def remove(namespace: Namespace, chains: Chains, installed: Installed | None, node: int) -> None:
    """Remove the run's chains and jumps (and each table if they created it)."""
    if installed is None:
        return
    try:
        with namespace.entered():
            if installed.of("nat"):
                _remove_here(chains.other("nat"), installed.created_nat)
            _remove_here(chains.other(TABLE), installed.created_table)
    except NamespaceGone:
        raise
    except ShapingError as exc:
        raise ShapingError(f"node {node}: iptables: {exc}") from exc


def _remove_here(chains: Chains, created_table: bool) -> None:
    table = chains.table
    save = _save(table)
    if has_chains(save, chains):
        _restore(remove_script(chains, present_jumps(save, chains)))
    if created_table and has_table(_save(), table) and table_is_empty(_save(table), table):
        try:
            delete_table("/proc/thread-self/ns/net", table)
        except OSError as exc:
            raise ShapingError(f"deleting the {table} table: {exc}") from exc
