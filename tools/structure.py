"""The house rules a reader relies on (docs/architecture.md), checked on the source's syntax.

Failures (exit 1):

- **an import circle**, counting every import: one inside a function (a lazy import still ties
  two rooms together) and one under ``if TYPE_CHECKING:`` (a reader still has to hold both
  modules to read either);
- **an import against the layers**: the core imports nothing above it and no Temporal module,
  the targets stand on the core alone;
- **a private name crossing a module**: ``x._name`` where ``x`` is not ``self``/``cls`` (or
  ``super()``) and ``_name`` is not defined in the module reading it, or ``from m import
  _name``. Where no public name exists (a private of a library), the line says why with a
  ``# private: <reason>`` comment and is not counted.

Warnings (printed, never failing): a module over 700 lines or a function over 80. A long module
whose concept is long stays whole: split along a seam, never to meet a line count.

``python tools/structure.py interlock_temporal workers`` prints each finding and exits 1 if any
is a failure.
"""

from __future__ import annotations

import ast
import re
import sys
from collections import defaultdict
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

MAX_MODULE_LINES = 700
MAX_FUNCTION_LINES = 80

#: which rooms a room may import (docs/architecture.md): the core imports nothing above it and no
#: Temporal module, the targets stand on the core alone; the adapter and the CLI sit on top
LAYERS: dict[str, tuple[str, ...]] = {
    "interlock_temporal.core": ("interlock_temporal.core",),
    "interlock_temporal.targets": ("interlock_temporal.core", "interlock_temporal.targets"),
}
FORBIDDEN: dict[str, tuple[str, ...]] = {
    "interlock_temporal.core": ("temporalio",),
    # the one core path of a framework's tool call: every framework's adapter stands on it
    "interlock_temporal._tools": ("agents", "mcp", "langgraph", "langchain", "pydantic_ai"),
}

#: names public although they start with an underscore: a named tuple's API (documented with
#: the underscore so it cannot clash with a field), ``os._exit`` and ``sys._getframe``
PUBLIC_UNDERSCORED = frozenset(
    {"_replace", "_asdict", "_fields", "_field_defaults", "_make", "_exit", "_getframe"}
)
#: the comment that says why a line reads a private name no public one replaces
EXCUSE = re.compile(r"#\s*private:\s*\S")
FAILURES = ("cycle", "layer", "private")


@dataclass(frozen=True)
class Breach:
    kind: str  # "cycle", "layer", "private" (failures); "module" or "function" (warnings)
    where: str
    size: int = 0

    @property
    def fails(self) -> bool:
        return self.kind in FAILURES

    def __str__(self) -> str:
        if self.kind == "cycle":
            return f"import circle: {self.where}"
        if self.kind == "layer":
            return f"import against the layers: {self.where}"
        if self.kind == "private":
            return f"private name of another module: {self.where}"
        limit = MAX_MODULE_LINES if self.kind == "module" else MAX_FUNCTION_LINES
        return f"warning: {self.kind} over {limit} lines: {self.where} ({self.size})"


def _modules(roots: Iterable[Path]) -> dict[str, Path]:
    found: dict[str, Path] = {}
    for root in roots:
        base = root.resolve().parent
        for path in sorted(root.resolve().rglob("*.py")):
            parts = path.relative_to(base).with_suffix("").parts
            if parts[-1] == "__init__":
                parts = parts[:-1]
            found[".".join(parts)] = path
    return found


def _external(tree: ast.AST) -> set[str]:
    """The top-level names of absolute imports (``from temporalio.x import y``: ``temporalio``)."""
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name.split(".")[0] for a in node.names)
        elif isinstance(node, ast.ImportFrom) and not node.level and node.module:
            out.add(node.module.split(".")[0])
    return out


def _within(name: str, room: str) -> bool:
    return name == room or name.startswith(room + ".")


def _layer_breaches(name: str, imports: set[str], external: set[str]) -> list[Breach]:
    breaches = []
    for room, allowed in LAYERS.items():
        if not _within(name, room):
            continue
        for target in sorted(imports):
            if _within(target, "interlock_temporal") and not any(
                _within(target, a) for a in allowed
            ):
                breaches.append(Breach("layer", f"{name} imports {target}"))
    for room, packages in FORBIDDEN.items():
        if _within(name, room):
            breaches.extend(
                Breach("layer", f"{name} imports {package}")
                for package in packages
                if package in external
            )
    return breaches


def _source(name: str, path: Path, node: ast.ImportFrom) -> str:
    """The absolute module an ``import from`` reads."""
    if not node.level:
        return node.module or ""
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    parts = package.split(".")
    parts = parts[: len(parts) - (node.level - 1)]
    return ".".join(parts + ([node.module] if node.module else []))


def _imports(name: str, path: Path, tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    out: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            source = _source(name, path, node)
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    out.add(f"{source}.{alias.name}")
                elif source in modules:
                    out.add(source)
    out.discard(name)
    return out


def _is_private(attr: str) -> bool:
    return attr.startswith("_") and not attr.startswith("__") and attr not in PUBLIC_UNDERSCORED


def _own_names(tree: ast.AST) -> set[str]:
    """What the module defines itself: its functions and classes (methods included), the
    names it binds, and the attributes it sets on ``self``/``cls``."""
    own: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef):
            own.add(node.name)
        elif isinstance(node, ast.Name) and isinstance(node.ctx, ast.Store):
            own.add(node.id)
        elif isinstance(node, ast.arg):
            own.add(node.arg)
        elif (
            isinstance(node, ast.Attribute)
            and isinstance(node.ctx, ast.Store)
            and isinstance(node.value, ast.Name)
            and node.value.id in ("self", "cls")
        ):
            own.add(node.attr)
    return own


def _excused(lines: list[str], node: ast.AST) -> bool:
    first = getattr(node, "lineno", 0)
    last = getattr(node, "end_lineno", None) or first
    return any(EXCUSE.search(lines[n - 1]) for n in range(first, last + 1) if 0 < n <= len(lines))


def _is_self(value: ast.expr) -> bool:
    if isinstance(value, ast.Name):
        return value.id in ("self", "cls")
    return (
        isinstance(value, ast.Call)
        and isinstance(value.func, ast.Name)
        and value.func.id == "super"
    )


def _private_breaches(
    name: str, path: Path, tree: ast.AST, text: str, modules: dict[str, Path]
) -> list[Breach]:
    """``x._name`` on another module's object, and ``from m import _name``."""
    own = _own_names(tree)
    lines = text.splitlines()
    found: list[Breach] = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Attribute) and _is_private(node.attr):
            if _is_self(node.value) or node.attr in own or _excused(lines, node):
                continue
            found.append(Breach("private", f"{path}:{node.lineno} {ast.unparse(node)}"))
        elif isinstance(node, ast.ImportFrom):
            source = _source(name, path, node)
            for alias in node.names:
                if not _is_private(alias.name) or f"{source}.{alias.name}" in modules:
                    continue  # a module (private to the package, not to another module)
                if not _excused(lines, node):
                    found.append(
                        Breach("private", f"{path}:{node.lineno} from {source} import {alias.name}")
                    )
    return found


def _cycles(graph: dict[str, set[str]]) -> Iterator[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            node, edges = work[-1]
            step = next(edges, None)
            if step is not None:
                if step not in index:
                    index[step] = low[step] = len(index)
                    stack.append(step)
                    on_stack.add(step)
                    work.append((step, iter(sorted(graph[step]))))
                elif step in on_stack:
                    low[node] = min(low[node], index[step])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    yield sorted(component)


def check(roots: Iterable[Path]) -> list[Breach]:
    """Every finding under ``roots``: failures (``Breach.fails``) and warnings."""
    modules = _modules(roots)
    graph: dict[str, set[str]] = defaultdict(set)
    breaches: list[Breach] = []
    for name, path in modules.items():
        text = path.read_text()
        tree = ast.parse(text)
        graph[name] = _imports(name, path, tree, modules)
        breaches.extend(_layer_breaches(name, graph[name], _external(tree)))
        breaches.extend(_private_breaches(name, path, tree, text, modules))
        lines = len(text.splitlines())
        if lines > MAX_MODULE_LINES:
            breaches.append(Breach("module", str(path), lines))
        for node in ast.walk(tree):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                size = (node.end_lineno or node.lineno) - node.lineno + 1
                if size > MAX_FUNCTION_LINES:
                    breaches.append(Breach("function", f"{path}:{node.lineno} {node.name}", size))
    breaches.extend(Breach("cycle", " <-> ".join(c)) for c in _cycles(graph))
    return breaches


def main(argv: list[str]) -> int:
    breaches = check(Path(a) for a in argv)
    for breach in sorted(breaches, key=lambda b: (not b.fails, b.kind, b.where)):
        print(breach)
    return 1 if any(b.fails for b in breaches) else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
