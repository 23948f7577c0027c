"""Lower layers never import higher ones (docs/ARCHITECTURE.md, DESIGN "Layers").

Read from the source with :mod:`ast`, so an import inside a function or behind
``TYPE_CHECKING`` counts as much as one at the top: each would tie the lower layer to
the higher one all the same.
"""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PROJECT = ("restms", "feeds", "auth", "bridges", "spark_sink", "gateway", "main")

# What each lower package may import of the project (itself always).
ALLOWED = {
    "restms": set(),
    "feeds": {"restms"},
}
# The engine service must stand alone, so another engine implements it without pulling
# in the embedded one: of the project, it imports only the protocol's values and handles.
SERVICE = (
    ROOT / "feeds" / "service.py",
    ROOT / "feeds" / "values.py",
    ROOT / "feeds" / "handles.py",
)
SERVICE_ALLOWED = {
    "restms.specs",
    "restms.errors",
    "restms.webhook",
    "feeds.values",
    "feeds.config",
    "feeds.handles",
}
# Bridges are clients of the engine: of ``feeds/`` they use the service alone, so they
# run unchanged over any engine that implements it (issue 23).
BRIDGES_ALLOWED = {"bridges", "restms"}
BRIDGES_ENGINE = {"feeds.service"}
# Every layer above the engine (the gateway, the bridges, the traffic mirror, the admin
# command line) reaches it through the engine service alone: of ``feeds/`` it imports
# ``feeds.service`` (the Protocol, its values and the settings an engine is opened
# with), so another engine stands behind it unchanged. main.py, the composition root,
# is the one place that names an engine.
ABOVE = ("gateway", "bridges", "spark_sink", "admincli")
COMPOSITION_ROOT = ROOT / "main.py"


def _imports(path: Path) -> set[str]:
    """Every project module ``path`` imports, as dotted names (relative ones resolved)."""
    package = path.relative_to(ROOT).with_suffix("").parts[:-1]
    return _imported(path.read_text(encoding="utf-8"), package)


def _imported(source: str, package: tuple[str, ...]) -> set[str]:
    tree = ast.parse(source)
    found: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - node.level + 1]
                found.add(".".join((*base, node.module or "")).rstrip("."))
            elif node.module:
                found.add(node.module)
    return {name for name in found if name.split(".")[0] in PROJECT}


@pytest.mark.parametrize("package", sorted(ALLOWED))
def test_lower_layers_import_nothing_above_them(package: str) -> None:
    allowed = {package, *ALLOWED[package]}
    wrong = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in sorted((ROOT / package).rglob("*.py"))
        for name in _imports(path)
        if name.split(".")[0] not in allowed
    }
    assert not wrong, sorted(wrong)


def test_the_engine_service_imports_only_the_protocols_values() -> None:
    for path in SERVICE:
        assert _imports(path) <= SERVICE_ALLOWED, path


def test_bridges_reach_the_engine_only_through_the_service() -> None:
    paths = sorted((ROOT / "bridges").rglob("*.py"))
    assert len(paths) > 5  # the reader finds the bridges
    wrong = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in paths
        for name in _imports(path)
        if name.split(".")[0] not in BRIDGES_ALLOWED and name not in BRIDGES_ENGINE
    }
    assert not wrong, sorted(wrong)


@pytest.mark.parametrize("package", ABOVE)
def test_the_layers_above_reach_the_engine_only_through_the_service(package: str) -> None:
    paths = sorted((ROOT / package).rglob("*.py"))
    assert paths  # the reader finds the package
    wrong = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in paths
        for name in _imports(path)
        if name.split(".")[0] == "feeds" and name != "feeds.service"
    }
    assert not wrong, sorted(wrong)


def test_the_gateway_takes_no_live_engine_and_neither_pages_nor_commits() -> None:
    """No gateway module takes an engine object from the app (an ENGINE or STORE key,
    ``.engine``) or pages and commits itself: every service call returns once its change
    is committed, and paging from disk is the engine's business."""
    paths = sorted((ROOT / "gateway").rglob("*.py"))
    users = [path for path in paths if "feeds.service" in _imports(path)]
    assert len(users) > 10  # the reader finds the modules that use the service
    live = {
        f"{path.relative_to(ROOT)}: lines {lines}"
        for path in paths
        if (lines := _live_engine(path, also=("STORE", "spill", "durability", "committed")))
    }
    assert not live, sorted(live)


def test_the_composition_root_alone_names_an_engine() -> None:
    engines = {name for name in _imports(COMPOSITION_ROOT) if name.split(".")[0] == "feeds"}
    assert engines == {"feeds.service", "feeds.embedded", "feeds.redis"}


def _live_engine(path: Path, also: tuple[str, ...] = ()) -> list[int]:
    """Lines of ``path`` that take the live engine from the app (its ENGINE key,
    ``State.engine``) or import a name in ``also``. The configuration's ``engine`` (the
    engine's name, a string) is read in the configuration module only."""
    names = {"ENGINE", *also}
    setting = path == ROOT / "gateway" / "server" / "config.py"
    return sorted(
        node.lineno
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8")))
        if (isinstance(node, ast.Attribute) and node.attr == "engine" and not setting)
        or (isinstance(node, ast.Name) and node.id == "ENGINE")
        or (isinstance(node, ast.alias) and node.name in names)
    )


def test_the_import_reader_sees_relative_and_nested_imports() -> None:
    """The check itself: a relative import, one in a function and one behind
    TYPE_CHECKING are all found (else the tests above could pass on anything)."""
    source = """
from typing import TYPE_CHECKING
from . import paging
from ..restms import specs
import gateway.app
if TYPE_CHECKING:
    from bridges.base import Port
def later():
    from spark_sink import mirror
"""
    assert _imported(source, ("feeds",)) == {
        "feeds",
        "restms",
        "gateway.app",
        "bridges.base",
        "spark_sink",
    }


def _gateway_graph() -> dict[str, set[str]]:
    """Which gateway modules each gateway module imports (``from gateway.x import m``
    counts as an import of the module ``gateway.x.m`` when there is one)."""
    modules = {
        ".".join(path.relative_to(ROOT).with_suffix("").parts): path
        for path in (ROOT / "gateway").rglob("*.py")
        if path.name != "__init__.py"
    }
    graph: dict[str, set[str]] = {}
    for name, path in modules.items():
        found: set[str] = set()
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Import):
                found.update(alias.name for alias in node.names if alias.name in modules)
            elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
                for alias in node.names:
                    module = f"{node.module}.{alias.name}"
                    if module in modules:
                        found.add(module)
                    elif node.module in modules:
                        found.add(node.module)
        graph[name] = found
    return graph


def _cycle(graph: dict[str, set[str]]) -> list[str] | None:
    """One import cycle of ``graph`` (its modules in order), or None."""
    done: set[str] = set()
    path: list[str] = []

    def visit(module: str) -> list[str] | None:
        if module in path:
            return [*path[path.index(module) :], module]
        if module in done:
            return None
        path.append(module)
        for imported in sorted(graph[module]):
            found = visit(imported)
            if found:
                return found
        path.pop()
        done.add(module)
        return None

    for module in sorted(graph):
        found = visit(module)
        if found:
            return found
    return None


def test_gateway_modules_import_each_other_without_a_cycle() -> None:
    """A newcomer can read the gateway bottom up: no module needs one that needs it
    (an import behind TYPE_CHECKING counts too)."""
    graph = _gateway_graph()
    assert len(graph) > 20  # the reader finds the modules
    assert any(graph.values())  # and their imports
    assert _cycle(graph) is None, " -> ".join(_cycle(graph) or [])


def test_the_cycle_finder_finds_a_cycle() -> None:
    assert _cycle({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": set()}) == ["a", "b", "c", "a"]
    assert _cycle({"a": {"b"}, "b": set()}) is None


def test_importing_the_service_loads_no_engine() -> None:
    """What another engine imports to implement the service brings in no embedded
    engine (import-time code the source reading above cannot see)."""
    code = (
        "import sys, feeds.service\n"
        "print(sorted(m for m in sys.modules if m.startswith(('feeds.', 'gateway', 'bridges'))))"
    )
    done = subprocess.run(
        [sys.executable, "-c", code],
        check=False,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr
    loaded = set(ast.literal_eval(done.stdout))
    assert "feeds.service" in loaded  # the check sees what it looks for
    alone = {"feeds.service", "feeds.values", "feeds.config", "feeds.handles"}
    assert loaded <= alone, sorted(loaded)
