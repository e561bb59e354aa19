"""The Python blocks of the README and docs/, each named by its file and a digest of its text.

A test that runs a block asks for it by that name, written out as a literal in the test:
``snippet("README.md#0123456789ab")``. The name changes with every edit of the block, so an
edited snippet is found by no test until one runs the new text and names it
(``tests/test_docs.py`` fails meanwhile, listing the block). ``python -m tests.doc_snippets``
prints every block's name and first line.

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
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
PYTHON = ("python", "py")


def documents() -> list[Path]:
    return [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]


def block_id(document: str, text: str) -> str:
    return f"{document}#{hashlib.sha256(text.encode()).hexdigest()[:12]}"


def python_blocks() -> dict[str, str]:
    """Every Python block of the README and docs/, by its name."""
    found: dict[str, str] = {}
    for path in documents():
        document = path.relative_to(ROOT).as_posix()
        for language, text in _FENCE.findall(path.read_text()):
            if language in PYTHON:
                found.setdefault(block_id(document, text), text)
    return found


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
    for name, text in python_blocks().items():
        first = text.splitlines()[0] if text.strip() else ""
        print(f"{name}  {'run by ' + ', '.join(ran[name]) if name in ran else 'RUN BY NO TEST'}")
        print(f"    {first}")
