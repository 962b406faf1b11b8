"""Docs that cannot drift: every ``squall ...`` command in README.md and docs/ parses with the CLI's own parser
(issue 40, item 6), and the plugin's options and fixtures are all in the guide's tables.

Commands are read from fenced code blocks (not ``python``, ``json`` or ``toml`` ones) and from inline
code spans: from the word ``squall`` (alone, or as the end of a path such as ``.venv/bin/squall``) to
the end of the span or line, with ``\\`` continuations joined, ``# comments`` and ``| pipes`` cut. The
parser is :func:`squall.cli.main.build_parser`, so a subcommand registered there is covered with no
change here. The docs' placeholders are read as such: an upper-case word (``FILE``, ``N``, ``P``),
``<...>``, ``...``, ``[optional]`` parts, ``a|b`` choices (the first is taken), and a placeholder that
fills a typed option gets a value of its type. A block that shows a deliberate mistake is preceded by
the line ``<!-- not a command: WHY -->`` and is skipped.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import re
import shlex
from dataclasses import dataclass
from pathlib import Path

import pytest

from squall.cli.main import build_parser

REPO = Path(__file__).resolve().parents[2]
SKIP_MARK = re.compile(r"<!--\s*not a command:.*?-->")
NOT_SHELL = {"python", "py", "json", "toml", "text", "console-output"}
#: ``squall`` as a command word: at the start, after a space, a backquote, a parenthesis or a path's slash,
#: then a subcommand (lower case) or an option; never ``squall.log``, ``squall:`` or ``squall ERROR``.
COMMAND = re.compile(r"(?:^|(?<=[\s`(])|(?<=bin/))squall\s+(?=[a-z-])")
PLACEHOLDER = re.compile(r"^(?:[A-Z][A-Z0-9_]*(?:\.\.\.)?|<[^>]*>|\.\.\.|[A-Z][A-Z0-9_]*=[A-Z][A-Z0-9_.]*)$")
SAMPLE = {int: "4", float: "1.0"}


@dataclass(frozen=True)
class Found:
    """One command line of the docs."""

    where: str  # file:line
    text: str  # from the word squall on


def doc_files() -> list[Path]:
    return [REPO / "README.md", *sorted((REPO / "docs").rglob("*.md"))]


def _commands_in(text: str) -> str | None:
    """The command starting at ``squall`` in ``text`` (a line or a span), cut at a comment or a pipe."""
    m = COMMAND.search(text)
    if m is None:
        return None
    command = text[m.start():]
    command = re.split(r"\s+#\s|\s+\|\s|\s+&&\s|\s*;\s|\s+\d?>\s", command)[0]
    return command.strip().rstrip("`").strip()


def find_commands(path: Path, root: Path = REPO) -> list[Found]:
    """Every command of the page at ``path`` (named relative to ``root``)."""
    found: list[Found] = []
    lines = path.read_text().splitlines()
    name = path.relative_to(root).as_posix()
    in_block, skip_block, language = False, False, ""
    pending = ""
    previous = ""
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if stripped.startswith("```"):
            if not in_block:
                in_block, language = True, stripped[3:].strip().split(" ")[0].lower()
                skip_block = bool(SKIP_MARK.search(previous)) or language in NOT_SHELL
            else:
                in_block, skip_block, pending = False, False, ""
            previous = line
            continue
        if stripped:
            previous = line
        if in_block:
            if skip_block:
                continue
            joined = pending + line
            if joined.rstrip().endswith("\\"):
                pending = joined.rstrip()[:-1] + " "
                continue
            pending = ""
            command = _commands_in(joined)
            if command:
                found.append(Found(f"{name}:{number}", command))
            continue
        for span in re.findall(r"`([^`]+)`", line):
            command = _commands_in(span)
            if command:
                found.append(Found(f"{name}:{number}", command))
    return found


def _actions(parser: argparse.ArgumentParser, words: list[str]) -> argparse.ArgumentParser:
    """The sub-parser ``words`` lead to (for the types of its options)."""
    current = parser
    for word in words:
        subs = [a for a in current._actions if isinstance(a, argparse._SubParsersAction)]
        if not subs or word not in subs[0].choices:
            break
        current = subs[0].choices[word]
    return current


def argv_of(command: str, parser: argparse.ArgumentParser) -> list[str]:
    """The docs' command as the argv the parser gets (see the module docstring for the placeholders)."""
    text = re.sub(r"\[([^\[\]]*)\]", r"\1", command)  # [--optional parts] are parts
    words = shlex.split(text, posix=True)[1:]  # without "squall"
    argv: list[str] = []
    for raw in words:
        word = raw.split("|", 1)[0] if "|" in raw and not raw.startswith("'") else raw
        if word == "--":
            argv.append(word)
            argv += ["COMMAND"]  # what follows is the user's command, whatever it is
            break
        if PLACEHOLDER.match(word) and argv and argv[-1].startswith("--"):
            sub = _actions(parser, [w for w in argv if not w.startswith("-")])
            option = next((a for a in sub._actions if argv[-1] in a.option_strings), None)
            kind = getattr(option, "type", None)
            argv.append(SAMPLE.get(kind, "x") if isinstance(kind, type) else "x")
            continue
        if word == "...":
            continue
        argv.append(word)
    return argv


def _parses(argv: list[str], parser: argparse.ArgumentParser) -> str:
    """'' when the parser takes ``argv``, else what it said.

    A mention rather than an invocation passes too: subcommand words alone (`squall calibrate`, whose
    required options the text gives elsewhere), or a known option at the end without its value
    (`squall run --protocol`).
    """
    err = io.StringIO()
    with contextlib.redirect_stderr(err), contextlib.redirect_stdout(io.StringIO()):
        try:
            parser.parse_args(argv)
        except SystemExit as exc:
            if exc.code in (0, None):
                return ""
            said = err.getvalue().strip().splitlines()[-1] if err.getvalue().strip() else f"exit {exc.code}"
            leaf = "squall " + " ".join(w for w in argv if not w.startswith("-"))
            if "the following arguments are required" in said and said.startswith(f"{leaf}:") and not any(
                    w.startswith("-") for w in argv):
                return ""  # the subcommand, named
            if argv and argv[-1].startswith("--") and said.endswith(f"argument {argv[-1]}: expected one argument"):
                return ""  # an option, named
            return said
    return ""


ALL = [c for path in doc_files() for c in find_commands(path)]


def test_the_docs_hold_commands_to_check() -> None:
    """The reader works: the pages name the subcommands they are about."""
    subcommands = {c.text.split()[1] for c in ALL}
    assert {"run", "matrix", "calibrate", "doctor", "image", "gc", "profiles"} <= subcommands, subcommands
    assert len(ALL) > 50


@pytest.mark.parametrize("found", ALL, ids=[f"{c.where} {c.text[:60]}" for c in ALL])
def test_every_command_in_the_docs_parses(found: Found) -> None:
    parser = build_parser()
    argv = argv_of(found.text, parser)
    problem = _parses(argv, parser)
    assert not problem, f"{found.where}: `{found.text}` does not parse ({problem}; argv {argv})"


def test_a_flag_the_cli_lacks_is_caught(tmp_path: Path) -> None:
    page = tmp_path / "page.md"
    page.write_text("Run `squall run --protocol ring --profile lan --wrokers 4`.\n\n```sh\nsquall doctr\n```\n\n"
                    "<!-- not a command: shows the error -->\n```sh\nsquall run --bogus\n```\n")
    parser = build_parser()
    found = [(c.text, _parses(argv_of(c.text, parser), parser)) for c in find_commands(page, root=tmp_path)]
    assert len(found) == 2
    assert "unrecognized arguments: --wrokers" in found[0][1]
    assert "invalid choice: 'doctr'" in found[1][1]


def test_the_plugins_options_and_fixtures_are_in_the_guide() -> None:
    guide = (REPO / "docs" / "writing-a-protocol.md").read_text()
    plugin = (REPO / "squall" / "pytest_plugin.py").read_text()
    options = sorted(set(re.findall(r'addoption\("(--squall-[a-z-]+)"', plugin)))
    fixtures = sorted(set(re.findall(r"@pytest\.fixture(?:\([^)]*\))?\ndef (squall_[a-z_]+)\(", plugin)))
    assert options and fixtures
    assert [o for o in options if f"`{o}" not in guide] == [], "options missing from the guide's table"
    assert [f for f in fixtures if f"| `{f}` |" not in guide] == [], "fixtures missing from the guide's table"
