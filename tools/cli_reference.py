"""Write ``docs/cli.md``, the reference of every ``interlock`` command, from the command's own
parser: ``python tools/cli_reference.py`` (``tests/test_cli_reference.py`` fails while the page
and the parser disagree, and names this command).

Each command's ``--help`` is shown as argparse prints it at a width of 100 columns, whatever
the terminal, so the page is the same on every machine.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from interlock_temporal.cli import build_parser  # noqa: E402

PAGE = ROOT / "docs" / "cli.md"
#: the width argparse formats for (it reads ``COLUMNS``)
WIDTH = "100"

INTRO = """\
# The `interlock` command

Every command and option of `interlock`, as its `--help` prints it. This page is generated from
the command's own parser (`python tools/cli_reference.py`); a test fails while the two disagree.
Exit codes, `--json` and durations are explained in the operator guide,
[the `interlock` command](operator-guide.md#the-interlock-command-exit-codes-json-durations).
"""


def _commands(
    parser: argparse.ArgumentParser, path: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], argparse.ArgumentParser]]:
    """Every parser, depth first, in the order ``--help`` lists them, with its words."""
    yield path, parser
    for action in parser._actions:  # argparse keeps its subparsers here, and nowhere public
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _commands(sub, (*path, name))


def render() -> str:
    """The page, from the parser as it is now."""
    # argparse wraps to $COLUMNS; the environment's own settings must not reach the defaults
    clean = {k: v for k, v in os.environ.items() if not k.startswith(("INTERLOCK_", "TEMPORAL_"))}
    with mock.patch.dict(os.environ, {**clean, "COLUMNS": WIDTH}, clear=True):
        parts = [INTRO]
        for path, parser in _commands(build_parser()):
            title = " ".join(("interlock", *path))
            level = "#" * min(2 + max(len(path) - 1, 0), 4)
            parts.append(f"{level} `{title}`\n\n```text\n{parser.format_help().rstrip()}\n```\n")
    return "\n".join(parts)


if __name__ == "__main__":
    PAGE.write_text(render())
    print(f"wrote {PAGE.relative_to(ROOT)}")
