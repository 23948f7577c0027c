"""Deleting pipes gives back what they held: no structure keeps per-pipe entries.

Cycles of pipes (each joined to a feed, with messages and an acknowledged read) are
made and deleted through HTTP on a real gateway. After each cycle, every dict, set,
list and deque reachable from the application's state (the engine, the metrics, the
idempotency and access tables) must hold as many entries as before the first
cycle. Counting entries, not RSS, keeps the test exact: the allocator may keep freed
pages (docs/OPERATIONS.md, "Memory"), a table may not keep entries.
"""

from __future__ import annotations

import asyncio
import collections
import sys
import types
from typing import Any

import pytest
from aiohttp import web

from tests.app.jsonapi import AJ, DOMAIN, delete, join, new_pipe, post, publish
from tests.app.process import ROOT
from tests.conftest import Gateway, MakeGateway

pytestmark = pytest.mark.app

CYCLES = 3
PIPES = 500
CONTAINERS = (dict, set, frozenset, list, collections.deque, collections.OrderedDict)
SKIP = (types.ModuleType, type, types.FunctionType, types.BuiltinFunctionType, asyncio.Task)
SCALARS = (str, bytes, int, float)


def entries(root: object) -> dict[str, int]:
    """The length of every container reachable from ``root`` through attributes and
    container items, by the first path it was reached on. The event loop, modules,
    classes and functions are not followed (they are not per-pipe state)."""
    seen: set[int] = set()
    found: dict[str, int] = {}
    todo: list[tuple[object, str]] = [(root, "app")]
    loop = asyncio.get_running_loop()
    while todo:
        obj, path = todo.pop()
        if id(obj) in seen or obj is loop or isinstance(obj, SKIP + SCALARS):
            continue
        seen.add(id(obj))
        if isinstance(obj, (dict, web.Application)):
            items = list(obj.items())
            found[path] = len(items)
            todo.extend((value, f"{path}[{type(key).__name__}]") for key, value in items)
            todo.extend((key, f"{path}<key>") for key, _ in items)
            continue
        if isinstance(obj, (*CONTAINERS, tuple)):
            if not isinstance(obj, tuple):
                found[path] = len(obj)
            todo.extend((item, f"{path}[]") for item in obj)
            continue
        names = list(getattr(obj, "__dict__", ()))
        for cls in type(obj).__mro__:
            slots = getattr(cls, "__slots__", ())
            names.extend([slots] if isinstance(slots, str) else slots)
        for name in names:
            try:
                value = getattr(obj, name)
            except AttributeError:
                continue
            todo.append((value, f"{path}.{name}"))
    return found


async def one_cycle(gw: Gateway, feed: str, cycle: int) -> None:
    gate = asyncio.Semaphore(16)

    async def make(n: int) -> dict[str, Any]:
        async with gate:
            pipe = await new_pipe(gw)
            await join(gw, pipe, feed, address=pipe["name"])
            return pipe

    pipes = await asyncio.gather(*(make(n) for n in range(PIPES)))
    messages = [
        {"address": pipe["name"], "message_id": f"c{cycle}-{n}-{k}", "content": [{"value": "x"}]}
        for n, pipe in enumerate(pipes)
        for k in range(2)
    ]
    assert await publish(gw, feed, *messages) == [1] * len(messages)
    # a read and an acknowledgement on a few pipes: leases, cursors and ETags exist
    for pipe in pipes[:20]:
        async with gw.http.get(pipe["uri"], headers=AJ) as r:
            listing = await r.json(content_type=None)
        first = listing["restms"]["pipe"][0]["message"][0]["href"]
        async with gw.http.get(first, headers=AJ) as r:
            assert r.status == 200
        assert await delete(gw, first) == 200

    async def remove(pipe: dict[str, Any]) -> None:
        async with gate:
            assert await delete(gw, pipe["uri"]) == 200

    await asyncio.gather(*(remove(pipe) for pipe in pipes))


async def test_deleted_pipes_leave_no_entries(make_gateway: MakeGateway) -> None:
    # The feed's deduplication window is full (at its bound) from the warm-up on; the
    # mirror is off (its queue and writer are bounded by their own settings); leases
    # that outlive their pipe must be gone by the next sweep, every 0.1 s here.
    gw = await make_gateway(
        rate_limit=0,
        max_pipes_per_principal=PIPES,
        max_joins_per_principal=2 * PIPES,
        dedup_max=2 * PIPES,
        mirror=False,
        sweep_interval=0.1,
    )
    status, _, feed = await post(gw, DOMAIN, feed=[{"name": "cycles", "type": "direct"}])
    assert status == 201
    # one warm-up cycle: lazily made, fixed-size state (codecs, the first lease's
    # timer, the mirror writer's first batch) exists before the baseline is taken
    await one_cycle(gw, feed, 0)
    before = entries(gw.app)
    for cycle in range(1, CYCLES + 1):
        await one_cycle(gw, feed, cycle)
        deadline = asyncio.get_running_loop().time() + 5.0
        while True:
            after = entries(gw.app)
            if sum(after.values()) <= sum(before.values()):
                break
            if asyncio.get_running_loop().time() > deadline:
                break
            await asyncio.sleep(0.1)
        # the sum decides (a table reached on another path after a cycle is the same
        # table); the paths that grew say where to look
        grown = {
            path: (before.get(path, 0), size)
            for path, size in after.items()
            if size > before.get(path, 0)
        }
        assert sum(after.values()) <= sum(before.values()), (
            f"cycle {cycle}: {sum(after.values()) - sum(before.values())} entries kept "
            f"after deletion; grown: {grown}"
        )


async def test_the_gateway_process_does_not_load_pyarrow() -> None:
    """pyarrow (about 42 MB of RSS) is for the mirror's writer process and the analytics
    worker; the gateway's own process hands them plain tuples and never imports it."""
    probe = (
        "import sys, main, gateway.server.app, gateway.server.run, admincli.commands\n"
        "print(sorted(m for m in sys.modules if m.split('.')[0] in ('pyarrow', 'pyspark')))"
    )
    proc = await asyncio.create_subprocess_exec(
        sys.executable,
        "-c",
        probe,
        cwd=ROOT,
        stdout=asyncio.subprocess.PIPE,
        stderr=asyncio.subprocess.PIPE,
    )
    async with asyncio.timeout(60):
        out, err = await proc.communicate()
    assert proc.returncode == 0, err.decode()
    assert out.decode().strip() == "[]"
