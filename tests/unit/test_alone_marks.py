"""Every test that disturbs what the other tests share carries the ``alone`` mark.

``scripts/test`` runs the suite on two worker processes, then the tests marked
``alone`` one at a time: a test that stops the broker, stops or kills a master of the
project's cluster, has it fail over or refuse writes, run beside others, would fail
whatever they were doing then. This reads every test module and finds the tests that
do such a thing, directly or through a function of their own module, and checks that
each is marked, on itself or on its module.
"""

from __future__ import annotations

import ast
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]

# What a test does that disturbs the others: a name it calls, an attribute it names
# (the broker's stop_app, handed to a thread), or a string it uses (a command it sends,
# the pid file of one of the cluster's instances, to signal it).
CALLS = {"refuse_commits", "instance_pid"}  # masters refusing writes; an instance's pid
ATTRIBUTES = {"stop_app"}
STRINGS = {"FAILOVER", "redis.pid"}


def _disturbs(node: ast.AST, helpers: set[str]) -> bool:
    for inner in ast.walk(node):
        if isinstance(inner, ast.Call) and isinstance(inner.func, ast.Name):
            if inner.func.id in CALLS | helpers:
                return True
            # scripts/cluster's "down" stops the whole cluster
            if inner.func.id == "cluster" and any(
                isinstance(a, ast.Constant) and a.value == "down" for a in inner.args
            ):
                return True
        if isinstance(inner, ast.Attribute) and inner.attr in ATTRIBUTES:
            return True
        if isinstance(inner, ast.Constant) and inner.value in STRINGS:
            return True
    return False


def _marked(node: ast.AST) -> bool:
    """Whether ``node`` names ``pytest.mark.alone``."""
    return any(
        isinstance(inner, ast.Attribute)
        and inner.attr == "alone"
        and isinstance(inner.value, ast.Attribute)
        and inner.value.attr == "mark"
        for inner in ast.walk(node)
    )


def _module_marked(tree: ast.Module) -> bool:
    return any(
        isinstance(statement, ast.Assign)
        and any(isinstance(t, ast.Name) and t.id == "pytestmark" for t in statement.targets)
        and _marked(statement.value)
        for statement in tree.body
    )


def disturbing_tests(tree: ast.Module) -> dict[str, bool]:
    """The module's tests that disturb the others, each with whether it is marked."""
    functions = [
        node for node in tree.body if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
    ]
    # Functions of the module that disturb, directly or through one another.
    helpers: set[str] = set()
    while True:
        more = {
            f.name
            for f in functions
            if not f.name.startswith("test_") and f.name not in helpers and _disturbs(f, helpers)
        }
        if not more:
            break
        helpers |= more
    module = _module_marked(tree)
    return {
        f.name: module or any(_marked(d) for d in f.decorator_list)
        for f in functions
        if f.name.startswith("test_") and _disturbs(f, helpers)
    }


def test_every_test_that_disturbs_the_others_is_marked_alone() -> None:
    found: dict[str, bool] = {}
    for path in sorted(TESTS.rglob("test_*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for name, marked in disturbing_tests(tree).items():
            found[f"{path.relative_to(TESTS.parent)}::{name}"] = marked
    unmarked = sorted(name for name, marked in found.items() if not marked)
    assert not unmarked, f"disturb what other tests share, not marked alone: {unmarked}"
    # The look finds what it is meant to: tests that stop a master, or the broker.
    stopped = "tests/app/test_master_stop.py::test_a_master_stopped_and_resumed_reuses_no_position"
    broker = "tests/integration/test_broker.py::test_stop_app_start_app_leaves_broker_usable"
    assert {stopped, broker} <= set(found)


def test_a_test_that_stops_the_broker_unmarked_is_found() -> None:
    source = """
import pytest

def stop(broker):
    broker.stop_app()

@pytest.mark.alone
async def test_marked(broker):
    stop(broker)

async def test_unmarked(broker):
    stop(broker)

async def test_harmless(broker):
    broker.publish("q", b"x")
"""
    assert disturbing_tests(ast.parse(source)) == {"test_marked": True, "test_unmarked": False}
