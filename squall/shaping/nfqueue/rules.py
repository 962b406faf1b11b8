"""iptables rules that send each source peer's packets to its own NFQUEUE, where they arrive.

Plan (pure functions, table-tested) and execution are separate. In the receiving namespace::

    iptables -w -t mangle -N SQUALL-<run>
    iptables -w -t mangle -A SQUALL-<run> -s <src>/32 -j NFQUEUE --queue-num <q> --queue-bypass
    ...                                                         (one rule per source peer)
    iptables -w -t mangle -I PREROUTING 1 -j SQUALL-<run>

``--queue-bypass``: while no daemon is bound to a queue, its packets pass unshaped instead of being
dropped. Removal undoes exactly that (jump, flush, delete chain). On the nf_tables backend the first
``-N`` in a namespace creates the whole ``ip mangle`` table; if the table did not exist before and
is empty after removal, it is deleted too (:mod:`.nft_table`), so ``iptables-save`` afterwards
prints what it printed before.

Commands run inside the namespace with ``nsenter --net=<netns path> --``.
"""

from __future__ import annotations

import ipaddress
import re
import subprocess
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from squall.shaping.kernel.iptables import has_table, normalize_save, table_is_empty
from squall.shaping.kernel.nft_table import delete_table

from .config import MAX_QUEUE
from .errors import RulesError

CHAIN_PREFIX = "SQUALL-"
MAX_CHAIN = 28  # iptables chain names: XT_EXTENSION_MAXNAMELEN - 1
TABLE = "mangle"
_RUN_ID = re.compile(r"^[A-Za-z0-9_.-]+$")

Runner = Callable[[list[str]], str]  # runs argv, returns stdout, raises RulesError


@dataclass(frozen=True)
class SourceRule:
    """Packets from ``source`` go to queue ``queue``."""

    source: str  # IPv4 address or network of the sending peer
    queue: int  # the NFQUEUE number the daemon binds for that peer

    def __post_init__(self) -> None:
        try:
            net = ipaddress.ip_network(self.source, strict=True)
        except ValueError as exc:
            raise RulesError(f"bad source {self.source!r}: {exc}") from None
        if net.version != 4:
            raise RulesError(f"source {self.source!r}: only IPv4 is shaped")
        if not 0 <= self.queue <= MAX_QUEUE:
            raise RulesError(f"queue {self.queue} outside [0, {MAX_QUEUE}]")

    @property
    def cidr(self) -> str:
        """The source as iptables prints it (``/32`` for a host)."""
        return str(ipaddress.ip_network(self.source))


@dataclass(frozen=True)
class InstalledRules:
    """What :func:`install` did, which :func:`remove` needs to undo it exactly."""

    netns: str  # namespace path the rules live in
    chain: str  # the run's chain in the mangle table
    created_table: bool  # the mangle table did not exist before install


def chain_name(run_id: str) -> str:
    """``SQUALL-<run_id>``, validated against iptables' name rules."""
    name = CHAIN_PREFIX + run_id
    if not _RUN_ID.match(run_id) or len(name) > MAX_CHAIN:
        raise RulesError(
            f"run id {run_id!r}: need [A-Za-z0-9_.-], at most {MAX_CHAIN - len(CHAIN_PREFIX)} chars"
        )
    return name


def _ipt(*args: str) -> list[str]:
    return ["iptables", "-w", "-t", TABLE, *args]


def install_argv(chain: str, rules: Sequence[SourceRule]) -> list[list[str]]:
    """Commands that create ``chain``, fill it and jump to it first thing in PREROUTING."""
    queues = [r.queue for r in rules]
    if len(set(queues)) != len(queues) or len({r.cidr for r in rules}) != len(rules):
        raise RulesError("each source and each queue may appear once per namespace")
    argv = [_ipt("-N", chain)]
    for rule in rules:
        target = ["-j", "NFQUEUE", "--queue-num", str(rule.queue), "--queue-bypass"]
        argv.append(_ipt("-A", chain, "-s", rule.cidr, *target))
    argv.append(_ipt("-I", "PREROUTING", "1", "-j", chain))
    return argv


def remove_argv(chain: str) -> list[list[str]]:
    """Commands that undo :func:`install_argv`: remove the jump, flush and delete the chain."""
    return [_ipt("-D", "PREROUTING", "-j", chain), _ipt("-F", chain), _ipt("-X", chain)]


def in_netns(netns: str, argv: Sequence[str]) -> list[str]:
    """``argv`` wrapped to run inside the network namespace at ``netns``."""
    return ["nsenter", f"--net={netns}", "--", *argv]


def _table_section(save_text: str, table: str) -> str:
    """The lines of one table (``*table`` to its ``COMMIT``) of a normalized ``iptables-save``."""
    out: list[str] = []
    for line in save_text.splitlines():
        if line == f"*{table}" or (out and out[-1] != "COMMIT"):
            out.append(line)
    return "\n".join(out)


def run(argv: list[str]) -> str:
    """The default runner: execute, return stdout, raise :class:`RulesError` with stderr."""
    proc = subprocess.run(argv, capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise RulesError(f"{' '.join(argv)} failed ({proc.returncode}): {proc.stderr.strip()}")
    return proc.stdout


def snapshot(netns: str, runner: Runner = run, table: str | None = None) -> str:
    """Normalized ``iptables-save`` of the namespace; with ``table``, an absent table prints as empty."""
    argv = ["iptables-save"] + (["-t", table] if table else [])
    return normalize_save(runner(in_netns(netns, argv)))


def install(netns: str, chain: str, rules: Sequence[SourceRule], runner: Runner = run) -> InstalledRules:
    """Install the per-source rules; on failure, undo what this call did and raise.

    If the chain already exists (another run with the same id), nothing is touched.
    """
    argv = install_argv(chain, rules)
    created = not has_table(snapshot(netns, runner))
    done = InstalledRules(netns=netns, chain=chain, created_table=created)
    executed = 0
    try:
        for cmd in argv:
            runner(in_netns(netns, cmd))
            executed += 1
    except RulesError:
        if executed:  # our chain exists: remove it (and the jump, if it was added)
            remove(done, runner, missing_ok=True)
        raise
    return done


def remove(installed: InstalledRules, runner: Runner = run, *, missing_ok: bool = False) -> None:
    """Undo :func:`install`; with ``missing_ok`` steps that find nothing to undo are skipped."""
    errors = []
    for cmd in remove_argv(installed.chain):
        try:
            runner(in_netns(installed.netns, cmd))
        except RulesError as exc:
            errors.append(str(exc))
    if errors and not missing_ok:
        raise RulesError("; ".join(errors))
    if installed.created_table:
        after = _table_section(snapshot(installed.netns, runner), TABLE)
        if after and table_is_empty(after):
            try:
                delete_table(installed.netns, TABLE)
            except OSError as exc:
                raise RulesError(f"deleting the {TABLE} table: {exc}") from exc
