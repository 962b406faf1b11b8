"""``squall protocols``: every protocol the catalog finds, with its description, paper and source.

The list is discovered, not kept: the ``protocol`` module of each folder under ``protocols/`` and
the entry-point group ``squall.protocols`` of installed packages (:mod:`squall.protocols.catalog`).
Exit codes: 0 listed, 2 bad usage or a malformed or duplicate declaration.

Also runnable on its own: ``python -m squall.cli.protocols protocols --json``.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from typing import Any

from squall.cli.profiles import format_table
from squall.protocols.catalog import Catalog, discover

EXIT_OK = 0
EXIT_USAGE = 2

COLUMNS = ("name", "description", "paper", "source")  # the table; --json adds entry, rejoins, needs


def add_subparser(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    """Register ``protocols`` on a parent command's sub-parsers."""
    parser = subparsers.add_parser("protocols", help="the protocols a matrix can name, and where each is declared")
    parser.add_argument("--json", action="store_true", help="print JSON instead of a table")
    parser.set_defaults(func=cmd_protocols)


def rows(catalog: Catalog) -> list[dict[str, Any]]:
    """One plain-data row per protocol, sorted by name."""
    return [
        {
            "name": name,
            "description": p.description,
            "paper": p.paper,
            "source": catalog.sources[name],
            "entry": p.entry,
            "rejoins": p.rejoins,
            "needs": sorted(p.needs),
        }
        for name, p in sorted(catalog.protocols.items())
    ]


def cmd_protocols(args: argparse.Namespace) -> int:
    """``protocols [--json]``."""
    from squall.training.declaration import DeclarationError  # squall.training loads torch

    try:
        found = rows(discover())
    except DeclarationError as exc:
        sys.stderr.write(f"error: {exc}\n")
        return EXIT_USAGE
    if args.json:
        sys.stdout.write(json.dumps(found, indent=2) + "\n")
    else:
        table = [[c.upper() for c in COLUMNS], *([row[c] or "-" for c in COLUMNS] for row in found)]
        sys.stdout.write(format_table(table) + "\n")
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """``python -m squall.cli.protocols protocols ...``."""
    parser = argparse.ArgumentParser(prog="squall", description=__doc__)
    add_subparser(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(levelname)s %(message)s", stream=sys.stderr)
    code: int = args.func(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
