"""The house rules a reader relies on: no import circle, no module over 700 lines, no function
over 80 (docs/architecture.md).

``python tools/structure.py interlock_temporal workers`` prints each breach and exits 1 if any.
Every import counts, also one inside a function (a lazy import still ties two rooms together);
only imports under ``if TYPE_CHECKING:`` are left out, since they never run.
"""

from __future__ import annotations

import ast
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
FORBIDDEN: dict[str, tuple[str, ...]] = {"interlock_temporal.core": ("temporalio",)}


@dataclass(frozen=True)
class Breach:
    kind: str  # "cycle", "layer", "module" or "function"
    where: str
    size: int = 0

    def __str__(self) -> str:
        if self.kind == "cycle":
            return f"import circle: {self.where}"
        if self.kind == "layer":
            return f"import against the layers: {self.where}"
        limit = MAX_MODULE_LINES if self.kind == "module" else MAX_FUNCTION_LINES
        return f"{self.kind} over {limit} lines: {self.where} ({self.size})"


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


def _type_checking_nodes(tree: ast.AST) -> set[int]:
    hidden: set[int] = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Name | ast.Attribute)
            and ast.unparse(node.test).endswith("TYPE_CHECKING")
        ):
            for child in node.body:
                hidden.update(id(n) for n in ast.walk(child))
    return hidden


def _external(tree: ast.AST) -> set[str]:
    """The top-level names of absolute imports (``from temporalio.x import y``: ``temporalio``)."""
    hidden = _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
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
        for package in FORBIDDEN.get(room, ()):
            if package in external:
                breaches.append(Breach("layer", f"{name} imports {package}"))
    return breaches


def _imports(name: str, path: Path, tree: ast.AST, modules: dict[str, Path]) -> set[str]:
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    hidden = _type_checking_nodes(tree)
    out: set[str] = set()
    for node in ast.walk(tree):
        if id(node) in hidden:
            continue
        if isinstance(node, ast.Import):
            out.update(a.name for a in node.names if a.name in modules)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                parts = package.split(".")
                parts = parts[: len(parts) - (node.level - 1)]
                source = ".".join(parts + ([node.module] if node.module else []))
            else:
                source = node.module or ""
            for alias in node.names:
                if f"{source}.{alias.name}" in modules:
                    out.add(f"{source}.{alias.name}")
                elif source in modules:
                    out.add(source)
    out.discard(name)
    return out


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
    modules = _modules(roots)
    graph: dict[str, set[str]] = defaultdict(set)
    breaches: list[Breach] = []
    for name, path in modules.items():
        text = path.read_text()
        tree = ast.parse(text)
        graph[name] = _imports(name, path, tree, modules)
        breaches.extend(_layer_breaches(name, graph[name], _external(tree)))
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
    for breach in breaches:
        print(breach)
    return 1 if breaches else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
