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


def test_an_import_only_for_type_checking_still_closes_a_circle(tmp_path: Path) -> None:
    """A reader holds both modules to read either, whether or not the import ever runs."""
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
    assert [str(b) for b in check([package])] == ["import circle: pkg.a <-> pkg.b"]


def test_a_private_name_read_across_modules_fails_unless_excused(tmp_path: Path) -> None:
    package = _package(
        tmp_path,
        {
            "__init__.py": "",
            "store.py": """\
                class Store:
                    def __init__(self):
                        self._db = None

                    def _write(self):
                        return self._db

                    def same(self, other: "Store"):
                        return other._db  # its own class's attribute: the module defines it

                def _helper():
                    return 1
                """,
            "user.py": """\
                import argparse
                from collections import namedtuple

                from .store import Store, _helper

                P = namedtuple("P", "a")

                def use(store: Store, parser: argparse.ArgumentParser):
                    store._write()
                    store._db = 1
                    P(1)._replace(a=2)
                    super_ok = super
                    parser.add_subparsers()._name_parser_map  # private: argparse has no public one
                    return store._db
                """,
        },
    )
    found = sorted(str(b).split("pkg/")[1] for b in check([package]))
    assert found == [
        "user.py:10 store._db",
        "user.py:14 store._db",
        "user.py:4 from pkg.store import _helper",
        "user.py:9 store._write",
    ]
    assert all(b.fails for b in check([package]))


def test_a_long_function_and_a_long_module_are_named_with_their_size(tmp_path: Path) -> None:
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    filler = "\n" * (MAX_MODULE_LINES - MAX_FUNCTION_LINES)
    package = _package(tmp_path, {"__init__.py": "", "big.py": f"def long():\n{body}\n{filler}"})
    found = check([package])
    assert {(b.kind, b.size) for b in found} == {
        ("function", MAX_FUNCTION_LINES + 1),
        ("module", MAX_MODULE_LINES + 1),
    }
    # a warning, never a failure: a long module whose concept is long stays whole
    assert not any(b.fails for b in found)
    assert all(str(b).startswith("warning: ") and "big.py" in str(b) for b in found)


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
    """No import circle (TYPE_CHECKING imports counted), no import against the layers and no
    private name of another module in the package; no import circle in workers/
    (docs/architecture.md). Long modules and functions are warnings only."""
    repo = Path(__file__).resolve().parent.parent
    package = [b for b in check([repo / "interlock_temporal"]) if b.fails]
    workers = [b for b in check([repo / "workers"]) if b.kind == "cycle"]
    assert [str(b) for b in package + workers] == []


def test_the_gate_is_built_by_composition() -> None:
    """``Gate`` holds its parts: no class of the protocol inherits another of its parts (a
    reader finds every ``self._x`` in its class's own file), and ``Gate`` has no base class."""
    import importlib
    import inspect
    import pkgutil

    from interlock_temporal.core import protocol
    from interlock_temporal.core.protocol import Gate

    assert Gate.__bases__ == (object,)
    inherited = []
    for info in pkgutil.iter_modules(protocol.__path__):
        module = importlib.import_module(f"{protocol.__name__}.{info.name}")
        for name, cls in inspect.getmembers(module, inspect.isclass):
            if cls.__module__ != module.__name__:
                continue
            inherited += [
                f"{name}({base.__name__})"
                for base in cls.__mro__[1:]
                if base.__module__.startswith(protocol.__name__)
            ]
    assert inherited == []
    from interlock_temporal.testing import throwaway_journal

    journal = throwaway_journal()
    try:
        held = {type(v).__name__: v for v in vars(Gate(journal)).values()}
        assert {"Recorder", "Admission", "Recovery", "Dispatch"} <= set(held)
        # tier 0 is reached through the dispatch alone
        assert "Atomic" in {type(v).__name__ for v in vars(held["Dispatch"]).values()}
    finally:
        journal.close()
