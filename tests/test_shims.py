"""The adapter's modules moved into ``_worker/`` and ``_reviews/`` (and ``_render`` into the CLI):
each old path stays one release (``core/deprecated.py``'s finder) and gives the module itself,
and nothing of the project itself imports an old path any more."""

from __future__ import annotations

import ast
import importlib
import sys
from pathlib import Path

import pytest

from interlock_temporal.core.deprecated import MODULES, REMOVED_IN

ROOT = Path(__file__).resolve().parents[1]

#: old module -> where its names live now
SHIMS = MODULES


def _fresh(old: str) -> object:
    """The shim imported anew (so that it warns again)."""
    sys.modules.pop(old, None)
    package, _, name = old.rpartition(".")
    vars(sys.modules[package]).pop(name, None)
    said = rf"{old} moved to {SHIMS[old]}; removed in {REMOVED_IN.replace('.', '[.]')}"
    with pytest.warns(DeprecationWarning, match=said):
        return importlib.import_module(old)


@pytest.mark.parametrize("old", sorted(SHIMS))
def test_an_old_path_gives_the_same_objects_and_says_where_they_live(old: str) -> None:
    shim = _fresh(old)
    new = importlib.import_module(SHIMS[old])
    assert shim is new  # the module itself: every name, private ones included, is the same
    assert getattr(sys.modules["interlock_temporal"], old.rpartition(".")[2]) is new
    assert not (ROOT / "interlock_temporal" / f"{old.rpartition('.')[2]}.py").exists()
    with pytest.raises(AttributeError):
        _ = shim.no_such_name


def test_a_path_that_never_existed_is_still_not_found() -> None:
    with pytest.raises(ModuleNotFoundError):
        importlib.import_module("interlock_temporal._no_such_module")


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
    found = []
    for folder in ("interlock_temporal", "workers", "workflows", "benchmarks", "tests", "tools"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if path == Path(__file__).resolve():
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
