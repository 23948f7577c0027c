"""The Redis engine's settings (:meth:`feeds.service.EngineService.setting`): one hash
in the namespace, ``{<namespace>:set}``, a field per name, shared by every node.

A change is made durable as a publish of a persistent message is: ``WAIT`` for a
replica after it, on the same connection (:mod:`.link`); when none confirms it the
caller gets 503 (the master may still hold the value: a retry finds it, and
``only_new`` then answers it). ``only_new`` is ``HSETNX`` then ``HGET`` in one
round trip on one connection: whichever node's ``HSETNX`` came first, every node is
answered that value, and only after a replica has it too.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..service import check_setting

if TYPE_CHECKING:
    from .service import RedisEngine


def key(engine: RedisEngine) -> str:
    return f"{{{engine.keys.ns}:set}}"


async def setting(engine: RedisEngine, name: str) -> str | None:
    check_setting(name)
    found = await engine.link.call(key(engine), "HGET", key(engine), name)
    return None if found is None else bytes(found).decode()


async def keep(engine: RedisEngine, name: str, value: str, only_new: bool) -> str:
    check_setting(name, value)
    where = key(engine)
    if not only_new:
        await engine.link.call(where, "HSET", where, name, value, write=True, durable=True)
        return value
    _made, held = await engine.link.batch(
        where, [("HSETNX", where, name, value), ("HGET", where, name)], write=True, durable=True
    )
    return bytes(held).decode()
