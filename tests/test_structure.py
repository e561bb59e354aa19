"""The checker behind the house rules (tools/structure.py) catches what it claims to."""

from __future__ import annotations

import textwrap
from pathlib import Path

from tools.structure import MAX_FUNCTION_LINES, MAX_MODULE_LINES, check


def _package(root: Path, files: dict[str, str]) -> Path:
    package = root / "pkg"
    package.mkdir()
    for name, text in files.items():
        path = package / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    return package


def test_a_lazy_import_inside_a_function_still_closes_a_circle(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "interface.py": "def open_it():\n    from .backend import B\n    return B\n",
            "backend.py": "from .interface import open_it\n",
        },
    )
    breaches = check([package])
    assert [b.kind for b in breaches] == ["cycle"]
    assert "pkg.backend <-> pkg.interface" in str(breaches[0])


def test_an_import_only_for_type_checking_is_no_circle(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "a.py": "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from .b import B\n",
            "b.py": "from .a import TYPE_CHECKING\n",
            "sub/__init__.py": "from .c import C\n",
            "sub/c.py": "from . import d\nC = 1\n",
            "sub/d.py": "",
        },
    )
    assert check([package]) == []


def test_a_long_function_and_a_long_module_are_named_with_their_size(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    filler = "\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES)
    package = _package(tmp_path, {"__init__.py": "", "big.py": f"def long():\n{body}\n{filler}"})
    found = {(b.kind, b.size) for b in check([package])}
    assert found == {("function", MAX_FUNCTION_LINES + 1), ("module", MAX_MODULE_LINES + 1)}
