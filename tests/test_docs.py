"""Every snippet in the README and on every page of the site (``docs/**/*.md``) still runs as
written: each Python block is run by a test (named there by its digest, ``tests/doc_snippets.py``)
or says in the page why it cannot run, is complete (every name it uses is
defined or imported in it, or named in a comment of it as given), parses, and each name it
imports from this package exists under that name (no deprecated alias); each ``interlock``
command it shows is a command the CLI knows."""

from __future__ import annotations

import ast
import contextlib
import importlib
import io
import json
import re
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Any

import pytest

from interlock_temporal.cli import main

from .doc_snippets import documents, executed, fences_of, not_run, python_blocks

ROOT = Path(__file__).resolve().parent.parent
DOCS = documents()
_PLACEHOLDER = re.compile(r"^[A-Z][A-Z0-9_:]*$")

PYTHON = sorted(python_blocks().items())


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


def test_the_docs_cover_every_page_of_the_site_subfolders_included() -> None:
    """The pages the docs tests read are the site's: every ``docs/**/*.md`` (mkdocs.yml's
    ``docs_dir``), the README and the changelog the site includes."""
    pages = {p.relative_to(ROOT).as_posix() for p in DOCS}
    assert "README.md" in pages and "CHANGELOG.md" in pages
    assert {"docs/concepts/effects.md", "docs/targets/stripe.md", "docs/api/index.md"} <= pages
    on_disk = {p.relative_to(ROOT).as_posix() for p in (ROOT / "docs").rglob("*.md")}
    assert on_disk <= pages
    assert "docs_dir: docs" in (ROOT / "mkdocs.yml").read_text()


def test_every_python_snippet_is_run_by_a_test_or_says_why_not() -> None:
    """A block no test names by its current digest is new or was edited since a test last ran
    it: a test must run it as written and name it (``snippet("<document>#<digest>")``), or the
    page must say why it cannot run (``<!-- not run: why -->`` on the line above its fence)."""
    ran = executed()
    marked = not_run()
    blocks = dict(PYTHON)
    unrun = [
        f"  {name}  {text.strip().splitlines()[0] if text.strip() else ''}"
        for name, text in PYTHON
        if name not in ran and not marked.get(name)
    ]
    assert not unrun, (
        "Python blocks of the docs that no test runs and that do not say why (a new block, or "
        "one edited since a test ran it; run it in a test and name it there with snippet(...), "
        "or put <!-- not run: why --> above its fence):\n" + "\n".join(unrun)
    )
    both = sorted(set(marked) & set(ran))
    assert not both, f"blocks marked as not run that a test runs (drop the mark): {both}"
    executed_blocks = sum(name in ran for name in blocks)
    print(f"{executed_blocks} of {len(blocks)} Python blocks of the docs run by a test")
    gone = [f"  {name} ({', '.join(where)})" for name, where in ran.items() if name not in blocks]
    assert not gone, "tests name Python blocks the docs no longer hold:\n" + "\n".join(gone)


def test_a_block_that_cannot_run_is_told_by_the_line_above_its_fence() -> None:
    """The mark is read from the line just above the fence, and only there; attributes after
    the language (``python title=...``) still make a Python block."""
    page = (
        "<!-- not run: it needs a live Stripe account -->\n```python\nimport stripe\n```\n\n"
        "<!-- not run: far away -->\n\n```python\nx = 1\n```\n\n"
        '```python title="y.py"\ny = 2\n```\n\n```sh\nls\n```\n'
    )
    found = [(text, reason) for _, text, reason in fences_of("page.md", page)]
    assert found == [
        ("import stripe\n", "it needs a live Stripe account"),
        ("x = 1\n", None),
        ("y = 2\n", None),
    ]


#: ruff's undefined-name rule alone, with none of the repository's settings
F821 = ["ruff", "check", "--isolated", "--no-cache", "--select", "F821", "--output-format", "json"]


def _ruff_f821(paths: list[str]) -> list[dict[str, Any]]:
    done = subprocess.run(
        [sys.executable, "-m", *F821, *paths], capture_output=True, text=True, timeout=60
    )
    assert done.returncode in (0, 1), done.stderr
    return json.loads(done.stdout)  # type: ignore[no-any-return]


def _undefined_names(tmp_path: Path) -> dict[str, set[str]]:
    """Names each block uses and never defines nor imports (ruff's F821), by block."""
    files = {}
    for n, (name, text) in enumerate(PYTHON):
        path = tmp_path / f"block_{n}.py"
        path.write_text(text)
        files[str(path)] = name
    found: dict[str, set[str]] = {}
    for finding in _ruff_f821(list(files)):
        undefined = re.fullmatch(r"Undefined name `(.+)`", finding["message"])
        assert undefined, finding["message"]
        found.setdefault(files[finding["filename"]], set()).add(undefined.group(1))
    return found


def test_every_python_snippet_is_complete(tmp_path: Path) -> None:
    """Every name a block uses is defined or imported in it; a block that relies on something
    the text around it gives must name it in a comment (``# refund and SupportCase as above``)."""
    blocks = dict(PYTHON)
    missing = []
    for name, undefined in _undefined_names(tmp_path).items():
        comments = " ".join(re.findall(r"#(.*)$", blocks[name], re.M))
        told = set(re.findall(r"\w+", comments))
        if undefined - told:
            missing.append(f"  {name}: {', '.join(sorted(undefined - told))}")
    assert not missing, "Python blocks that use names they never define:\n" + "\n".join(missing)


def test_the_completeness_check_sees_an_undefined_name(tmp_path: Path) -> None:
    """The check above can fail: ruff reports a name the block never defines."""
    path = tmp_path / "block.py"
    path.write_text("from datetime import timedelta\n\nwait = timedelta(seconds=1) + later\n")
    assert [f["message"] for f in _ruff_f821([str(path)])] == ["Undefined name `later`"]


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
