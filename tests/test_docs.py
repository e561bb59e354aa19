"""Every snippet in the README and docs/ still runs as written: each Python block parses, each name
it imports from this package exists under that name (no deprecated alias), and each ``interlock``
command it shows is a command the CLI knows."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import re
import warnings
from pathlib import Path

import pytest

from interlock_temporal.cli import main

ROOT = Path(__file__).resolve().parent.parent
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.M | re.S)
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_:]*$")


def _blocks(language: set[str]) -> list[tuple[str, str]]:
    found = []
    for path in DOCS:
        for n, match in enumerate(_FENCE.finditer(path.read_text())):
            if match.group(1) in language:
                found.append((f"{path.relative_to(ROOT)}#{n}", match.group(2)))
    return found


PYTHON = _blocks({"python", "py"})


def _imports(tree: ast.AST) -> list[tuple[str, str]]:
    return [
        (node.module, alias.name)
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and (node.module or "").startswith("interlock_temporal")
        for alias in node.names
    ]


def test_the_docs_have_python_snippets_that_import_the_package() -> None:
    assert len(PYTHON) >= 7
    assert sum(len(_imports(_parse(text))) for _, text in PYTHON) >= 9


def _parse(text: str) -> ast.AST:
    flags = ast.PyCF_ONLY_AST | ast.PyCF_ALLOW_TOP_LEVEL_AWAIT
    return compile(text, "<snippet>", "exec", flags=flags, dont_inherit=True)  # type: ignore[no-any-return]


@pytest.mark.parametrize(("where", "text"), PYTHON, ids=[w for w, _ in PYTHON])
def test_each_python_snippet_parses_and_imports_names_that_exist(where: str, text: str) -> None:
    tree = _parse(text)
    for module, name in _imports(tree):
        with warnings.catch_warnings():
            warnings.simplefilter("error", DeprecationWarning)
            imported = importlib.import_module(module)
            assert hasattr(imported, name), f"{where}: {module} has no {name}"


def _command_lines() -> list[tuple[str, str]]:
    """Lines that show an ``interlock`` command: inside a fence, or an indented code block."""
    found = []
    for path in DOCS:
        fenced = False
        for n, line in enumerate(path.read_text().splitlines(), 1):
            if line.startswith("```"):
                fenced = not fenced
                continue
            words = line.strip().removeprefix("$ ")
            if words.startswith("interlock ") and (fenced or line.startswith("    ")):
                found.append((f"{path.relative_to(ROOT)}:{n}", words))
    return found


def _commands() -> list[tuple[str, list[str]]]:
    found: list[tuple[str, list[str]]] = []
    for where, line in _command_lines():
        path: list[str] = []
        rest = iter(line.split()[1:])
        for word in rest:
            if word.startswith("--"):
                if "=" not in word and word in {"--journal", "--key"}:
                    next(rest, None)
                continue
            if word.startswith(("-", "[", "#", ">", "|")) or _PLACEHOLDER.match(word):
                break
            path.append(word)
            if len(path) == 2:
                break
        for verb in path[1].split("|") if len(path) > 1 else [None]:
            found.append((where, [path[0], *([verb] if verb else [])]))
    return found


COMMANDS = _commands()


def test_the_docs_show_cli_commands() -> None:
    assert len(COMMANDS) >= 20


@pytest.mark.parametrize(("where", "command"), COMMANDS, ids=[" ".join(c) for _, c in COMMANDS])
def test_each_cli_command_in_the_docs_exists(where: str, command: list[str]) -> None:
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        code = main([*command, "--help"])
    assert code == 0, f"{where}: `interlock {' '.join(command)}` is not a command: {err.getvalue()}"
    assert "usage: interlock" in out.getvalue()
