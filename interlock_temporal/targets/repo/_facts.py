"""The facts a repository edit relies on: a file's content, a Python symbol's source, by the
digest of what they are on the branch; and the checks on the paths and names that name them."""

from __future__ import annotations

import ast
import hashlib
import threading
from pathlib import PurePosixPath

#: the commit trailer that names the effect a commit is
TRAILER = "Interlock-Effect"
#: the value of a fact about a file or symbol that does not exist
ABSENT = "absent"
_SHA = "sha256:"
#: one parse at a time: CPython 3.11 (3.11.7 here) keeps the AST converter's recursion depth in
#: state shared by all threads, and two threads parsing at once can fail with "AST constructor
#: recursion depth mismatch" (CPython gh-106905); a worker runs activities on several threads
_PARSE_LOCK = threading.Lock()
_UNPARSEABLE = "unparseable:"


def parse_python(text: str | bytes) -> ast.Module:
    """``ast.parse``, one thread at a time (see ``_PARSE_LOCK``): every parse of this target
    goes through here."""
    with _PARSE_LOCK:
        return ast.parse(text)


# -- facts ----------------------------------------------------------------------------------------


def file_fact(path: str) -> str:
    """The name of the fact "the content of ``path``"."""
    return f"file:{norm_path(path)}"


def symbol_fact(path: str, qualname: str) -> str:
    """The name of the fact "the source of ``qualname`` in ``path``" (``Class.method`` nests)."""
    return f"symbol:{norm_path(path)}::{check_qualname(qualname)}"


def parse_fact(name: str) -> tuple[str, str | None] | None:
    """(path, qualname or None for a whole file), or None for a name this target does not know."""
    try:
        if name.startswith("file:"):
            return norm_path(name[5:]), None
        if name.startswith("symbol:"):
            path, sep, qual = name[7:].rpartition("::")
            if not sep:
                return None
            return norm_path(path), check_qualname(qual)
    except ValueError:
        return None
    return None


def _digest(data: bytes) -> str:
    return _SHA + hashlib.sha256(data).hexdigest()


def file_value(content: bytes | None) -> str:
    return ABSENT if content is None else _digest(content)


def symbol_value(content: bytes | None, qualname: str) -> str:
    """The fact value of ``qualname`` in a file's ``content``: the digest of ``ast.unparse`` of
    its node (decorators included, comments, formatting and positions not), ``absent`` when the
    file or the symbol does not exist, ``unparseable:<file digest>`` when the file is not Python
    this interpreter can parse (so any change of it is still seen)."""
    if content is None:
        return ABSENT
    try:
        module = parse_python(content)
    except (SyntaxError, ValueError):
        return _UNPARSEABLE + _digest(content)
    node = locate(module, qualname)
    return ABSENT if node is None else _digest(ast.unparse(node).encode())


def defined_name(stmt: ast.stmt) -> str | None:
    if isinstance(stmt, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
        return stmt.name
    if isinstance(stmt, ast.Assign) and len(stmt.targets) == 1:
        target = stmt.targets[0]
        return target.id if isinstance(target, ast.Name) else None
    if isinstance(stmt, ast.AnnAssign) and isinstance(stmt.target, ast.Name):
        return stmt.target.id
    return None


def locate(module: ast.Module, qualname: str) -> ast.stmt | None:
    """The statement that defines ``qualname`` (the last one, as Python binds it)."""
    body: list[ast.stmt] = module.body
    parts = qualname.split(".")
    node: ast.stmt | None = None
    for i, part in enumerate(parts):
        found = None
        for stmt in body:
            if defined_name(stmt) == part:
                found = stmt
        if found is None:
            return None
        if i < len(parts) - 1:
            if not isinstance(found, ast.ClassDef):
                return None
            body = found.body
        node = found
    return node


def norm_path(value: str) -> str:
    if not value or "\n" in value or "\0" in value or "\\" in value:
        raise ValueError("a repository path is a non-empty relative POSIX path")
    p = PurePosixPath(value)
    if p.is_absolute() or any(part in ("..", ".") for part in value.split("/")):
        raise ValueError("a repository path must be relative, without '.' or '..'")
    if p.parts[0] == ".git":
        raise ValueError("a repository path must not be inside .git")
    return str(p)


def check_qualname(value: str) -> str:
    if not value or not all(part.isidentifier() for part in value.split(".")):
        raise ValueError("a symbol is a dotted Python name, e.g. 'helper' or 'Parser.parse'")
    return value
