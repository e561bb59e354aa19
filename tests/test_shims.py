"""The adapter's modules moved into ``_worker/`` and ``_reviews/`` (and ``_render`` into the CLI):
each old path stays one release as an import shim that gives the same objects, and nothing of
the project itself imports an old path any more."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: old module -> where its names live now
SHIMS = {
    **{
        f"interlock_temporal._{name}": f"interlock_temporal._worker.{name}"
        for name in (
            "codec",
            "context",
            "errors",
            "gated",
            "install",
            "interceptor",
            "logs",
            "plugin",
            "runtime",
            "sticky",
            "telemetry",
        )
    },
    "interlock_temporal._review_workflow": "interlock_temporal._reviews.workflow",
    "interlock_temporal._review": "interlock_temporal._reviews.desk",
    "interlock_temporal._reconciler": "interlock_temporal._reviews.reconciler",
    "interlock_temporal._notifying": "interlock_temporal._reviews.notifying",
    "interlock_temporal._render": "interlock_temporal.cli._render",
}


def _fresh(old: str) -> object:
    """The shim imported anew (so that it warns again)."""
    sys.modules.pop(old, None)
    package, _, name = old.rpartition(".")
    vars(sys.modules[package]).pop(name, None)
    said = rf"{old} moved to {SHIMS[old]}; the old path is removed in 0\.3\.0"
    with pytest.warns(DeprecationWarning, match=said):
        return importlib.import_module(old)


@pytest.mark.parametrize("old", sorted(SHIMS))
def test_an_old_path_gives_the_same_objects_and_says_where_they_live(old: str) -> None:
    shim = _fresh(old)
    new = importlib.import_module(SHIMS[old])
    names = [n for n in vars(new) if not (n.startswith("__") and n.endswith("__"))]
    assert names
    for name in names:
        assert getattr(shim, name) is getattr(new, name), name
    assert SHIMS[old] in (shim.__doc__ or "") and "removed in 0.3.0" in (shim.__doc__ or "")
    with pytest.raises(AttributeError):
        _ = shim.no_such_name  # type: ignore[attr-defined]


def test_the_names_code_outside_the_package_imported_still_import() -> None:
    """What tests and apps imported from the old paths before the move."""
    _fresh("interlock_temporal._review_workflow")
    _fresh("interlock_temporal._plugin")
    _fresh("interlock_temporal._gated")
    from interlock_temporal._gated import spec_of
    from interlock_temporal._plugin import _with_pydantic
    from interlock_temporal._review_workflow import EffectReview, ReviewRequest, ReviewStatus
    from interlock_temporal._reviews import workflow
    from interlock_temporal._worker import gated, plugin

    assert (EffectReview, ReviewRequest, ReviewStatus) == (
        workflow.EffectReview,
        workflow.ReviewRequest,
        workflow.ReviewStatus,
    )
    assert _with_pydantic is plugin._with_pydantic
    assert spec_of is gated.spec_of


def test_nothing_in_the_project_imports_an_old_path() -> None:
    """The shims are for code outside the package only."""
    shims = {ROOT / "interlock_temporal" / f"{old.rpartition('.')[2]}.py" for old in SHIMS}
    found = []
    for folder in ("interlock_temporal", "workers", "workflows", "benchmarks", "tests", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path in shims or path == Path(__file__).resolve():
                continue
            package = ".".join(path.relative_to(ROOT).parent.parts)
            for node in ast.walk(ast.parse(path.read_text())):
                names: list[str] = []
                if isinstance(node, ast.Import):
                    names = [a.name for a in node.names]
                elif isinstance(node, ast.ImportFrom):
                    base = node.module or ""
                    if node.level:
                        parts = package.split(".")
                        parts = parts[: len(parts) - (node.level - 1)]
                        base = ".".join([*parts, *([node.module] if node.module else [])])
                    names = [base, *(f"{base}.{a.name}" for a in node.names)]
                for name in names:
                    if name in SHIMS:
                        found.append(f"{path.relative_to(ROOT)}:{node.lineno} {name}")
    assert found == []
