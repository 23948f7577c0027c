"""``restms.specs`` is a package of small modules with one public surface: every public
name its modules define is importable from ``restms.specs`` itself, as the same object."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import restms.specs

PACKAGE = Path(restms.specs.__file__).parent
MODULES = sorted(path.stem for path in PACKAGE.glob("_*.py") if path.stem != "__init__")


def _defined(module: str) -> set[str]:
    """The public names a module of the package defines at its top level (read from the
    source, so names it imports from elsewhere are not counted)."""
    tree = ast.parse((PACKAGE / f"{module}.py").read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.ClassDef)):
            names.add(node.name)
        elif isinstance(node, ast.Assign):
            names.update(target.id for target in node.targets if isinstance(target, ast.Name))
        elif isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name):
            names.add(node.target.id)
    return {name for name in names if not name.startswith("_")}


def test_the_reader_finds_the_definitions() -> None:
    assert {"_messages", "_read_messages", "_resources"} <= set(MODULES)
    assert {"MessageSpec", "head_size", "Content"} <= _defined("_messages")
    assert "PROPERTIES" in _defined("_properties")


def test_every_public_name_of_the_modules_is_re_exported() -> None:
    missing = {
        f"{module}.{name}"
        for module in MODULES
        for name in _defined(module)
        if name not in restms.specs.__all__
        or getattr(restms.specs, name)
        is not getattr(importlib.import_module(f"restms.specs.{module}"), name)
    }
    assert not missing, sorted(missing)


def test_the_surface_lists_only_what_it_has_and_no_module_shadows_a_name() -> None:
    assert all(hasattr(restms.specs, name) for name in restms.specs.__all__)
    assert not set(MODULES) & set(restms.specs.__all__)  # e.g. a module named "messages"
