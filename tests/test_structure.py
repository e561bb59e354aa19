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


def test_the_core_importing_the_adapter_or_temporal_is_against_the_layers(tmp_path: Path) -> None:
    root = tmp_path / "interlock_temporal"
    for name, text in {
        "__init__.py": "",
        "_plugin.py": "from .core import gate\n",
        "core/__init__.py": "",
        "core/gate.py": "def later():\n    from temporalio import activity\n    return activity\n",
        "core/view.py": "from .. import _plugin\n",
        "targets/__init__.py": "",
        "targets/mail.py": "from ..core import gate\nfrom .._plugin import x\n",
    }.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    layers = sorted(str(b) for b in check([root]) if b.kind == "layer")
    assert layers == [
        "import against the layers: interlock_temporal.core.gate imports temporalio",
        "import against the layers: interlock_temporal.core.view imports "
        "interlock_temporal._plugin",
        "import against the layers: interlock_temporal.targets.mail imports "
        "interlock_temporal._plugin",
    ]


def test_the_package_and_the_workers_keep_the_house_rules() -> None:
    """No import circle, no import against the layers, no module over 700 lines and no function
    over 80 in the package; no import circle in workers/ (docs/architecture.md)."""
    repo = Path(__file__).resolve().parent.parent
    package = check([repo / "interlock_temporal"])
    workers = [b for b in check([repo / "workers"]) if b.kind == "cycle"]
    assert [str(b) for b in package + workers] == []
