"""The Python blocks of the README and every page of the site (``docs/**/*.md``), each named by
its file and a digest of its text.

A test that runs a block asks for it by that name, written out as a literal in the test:
``snippet("README.md#0123456789ab")``. The name changes with every edit of the block, so an
edited snippet is found by no test until one runs the new text and names it
(``tests/test_docs.py`` fails meanwhile, listing the block). A block that cannot run says why in
the line just above its fence, a comment neither GitHub nor the site shows:
``<!-- not run: it needs a live Stripe account -->``. ``python -m tests.doc_snippets`` prints
every block's name, first line and who runs it.

The glue a test may add is the least a user adds: ``as_program`` runs a block written with
top-level ``await`` (as the docs write what a program does inside its ``async def main``), and
``swap`` replaces an exact text the docs show as a placeholder (a server's address, a path).
"""

from __future__ import annotations

import ast
import hashlib
import importlib.util
import re
import sys
import textwrap
import uuid
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parent.parent
TESTS = Path(__file__).resolve().parent
#: a fence, its language (attributes after it, ``python title="x.py"``, are allowed) and its text
_FENCE = re.compile(r"^```(\w*)[^\n]*\n(.*?)^```", re.M | re.S)
#: the marker of a block that cannot run, on the line above its fence: its reason
_NOT_RUN = re.compile(r"<!--\s*not run:\s*(.*?)\s*-->\s*\Z", re.S)
PYTHON = ("python", "py", "python3")


def documents() -> list[Path]:
    """The README, the changelog and every page of the site, subfolders included."""
    return [ROOT / "README.md", ROOT / "CHANGELOG.md", *sorted((ROOT / "docs").rglob("*.md"))]


def block_id(document: str, text: str) -> str:
    return f"{document}#{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def fences_of(document: str, source: str) -> Iterator[tuple[str, str, str | None]]:
    """Each Python block of ``source``: its name, its text, and the reason it cannot run if
    the line above its fence gives one."""
    for match in _FENCE.finditer(source):
        language, text = match.group(1), match.group(2)
        if language.lower() not in PYTHON:
            continue
        # the line just above the fence (a blank line between them breaks the mark)
        before = source[: match.start()].removesuffix("\n").rsplit("\n", 1)[-1]
        marked = _NOT_RUN.search(before)
        yield block_id(document, text), text, marked.group(1) if marked else None


def _python_fences() -> Iterator[tuple[str, str, str | None]]:
    for path in documents():
        yield from fences_of(path.relative_to(ROOT).as_posix(), path.read_text())


def python_blocks() -> dict[str, str]:
    """Every Python block of the README and the site, by its name."""
    found: dict[str, str] = {}
    for name, text, _ in _python_fences():
        found.setdefault(name, text)
    return found


def not_run() -> dict[str, str]:
    """The blocks marked as not run, by name: the reason each gives (empty if it gives none)."""
    return {name: reason for name, _, reason in _python_fences() if reason is not None}


def snippet(name: str) -> str:
    """The block ``name`` (``"README.md#<digest>"``), exactly as the document shows it."""
    blocks = python_blocks()
    if name not in blocks:
        document = name.partition("#")[0]
        raise AssertionError(
            f"{document} has no Python block {name}: it was edited or removed. Run this test "
            f"against the block's new text and name it here (python -m tests.doc_snippets "
            "lists the blocks and their names)"
        )
    return blocks[name]


def swap(text: str, old: str, new: str) -> str:
    """``text`` with the one occurrence of ``old`` replaced (a placeholder the docs show)."""
    count = text.count(old)
    assert count == 1, f"the snippet shows {old!r} {count} times, not once"
    return text.replace(old, new)


def as_program(text: str, *, before: str = "", after: str = "") -> str:
    """A block written with top-level ``await``, run as a program: its lines become the body
    of ``async def main()`` (between ``before`` and ``after``, glue of the test's own)."""
    body = "\n".join(part for part in (before, text, after) if part)
    return (
        "import asyncio\n\n\nasync def main() -> None:\n"
        + textwrap.indent(body, "    ")
        + "\n\nasyncio.run(main())\n"
    )


def load(text: str, path: Path) -> ModuleType:
    """``text`` written to ``path`` and imported from there, as its own module (a name of its
    own, so two tests' copies of one block never meet in ``sys.modules``)."""
    path.write_text(text)
    name = f"{path.stem}_{uuid.uuid4().hex[:8]}"
    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _named_in(path: Path) -> Iterator[tuple[str, int]]:
    source = path.read_text()
    if "snippet(" not in source:
        return
    for node in ast.walk(ast.parse(source, str(path))):
        if (
            isinstance(node, ast.Call)
            and getattr(node.func, "id", getattr(node.func, "attr", None)) == "snippet"
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            yield node.args[0].value, node.lineno


def executed() -> dict[str, list[str]]:
    """The blocks the tests run: each name given to ``snippet(...)`` as a literal in a test
    module, with where."""
    found: dict[str, list[str]] = {}
    for path in sorted(TESTS.glob("*.py")):
        if path.name == Path(__file__).name:
            continue
        for name, line in _named_in(path):
            found.setdefault(name, []).append(f"tests/{path.name}:{line}")
    return found


if __name__ == "__main__":
    ran = executed()
    marked = not_run()
    blocks = python_blocks()
    for name, text in blocks.items():
        first = text.splitlines()[0] if text.strip() else ""
        if name in ran:
            who = "run by " + ", ".join(ran[name])
        elif name in marked:
            who = f"not run: {marked[name]}"
        else:
            who = "RUN BY NO TEST"
        print(f"{name}  {who}")
        print(f"    {first}")
    print(f"{sum(n in ran for n in blocks)} of {len(blocks)} Python blocks run by a test")
