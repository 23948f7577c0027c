"""The Redis engine's settings (:meth:`feeds.service.EngineService.setting`): one hash
in the namespace, ``{<namespace>:set}``, a field per name, shared by every node.

A change is made durable as a publish of a persistent message is: ``WAIT`` for a
replica after it, on the same connection (:mod:`.link`); when none confirms it the
caller gets 503 (the master may still hold the value: a retry finds it, and
``only_new`` then answers it). ``only_new`` is ``HSETNX`` then ``HGET`` in one
round trip on one connection: whichever node's ``HSETNX`` came first, every node is
answered that value, and only after a replica has it too. ``drop`` with ``only``
compares and deletes in one script (``EVAL``), so it is one step on the master as
``HSETNX`` is.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..service import check_prefix, check_setting

if TYPE_CHECKING:
    from .service import RedisEngine


# Delete the field only while it holds ARGV[2]: 1 when deleted, else 0.
DROP_IF = """
if redis.call('HGET', KEYS[1], ARGV[1]) == ARGV[2] then
  return redis.call('HDEL', KEYS[1], ARGV[1])
end
return 0
"""


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


async def listed(engine: RedisEngine, prefix: str) -> tuple[tuple[str, str], ...]:
    check_prefix(prefix)
    where = key(engine)
    flat = await engine.link.call(where, "HGETALL", where)
    if isinstance(flat, dict):
        pairs = [(bytes(n).decode(), bytes(v).decode()) for n, v in flat.items()]
    else:
        pairs = [
            (bytes(flat[i]).decode(), bytes(flat[i + 1]).decode()) for i in range(0, len(flat), 2)
        ]
    return tuple(sorted(pair for pair in pairs if pair[0].startswith(prefix)))


async def drop(engine: RedisEngine, name: str, only: str | None) -> bool:
    check_setting(name, only)
    where = key(engine)
    if only is None:
        gone = await engine.link.call(where, "HDEL", where, name, write=True, durable=True)
    else:
        gone = await engine.link.call(
            where, "EVAL", DROP_IF, 1, where, name, only, write=True, durable=True
        )
    return bool(gone)
