"""Origin stamps (``Message.stamp``): one per published message, the same in each of its
copies, never the same for two published messages, and kept wherever the message goes
(a restart, a redelivery, a feed's queue, a cursor, a dead letter). Federation names a
message without a message_id by it (docs/FEDERATION.md)."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path

import orjson

from feeds.embedded import EmbeddedEngine
from feeds.redis.values import decode_message
from feeds.service import EngineService, Message
from feeds.store import FILE_NAME, record, stamp_of

from .conftest import MakeEngine
from .helpers import ME, join, msg, new_feed, new_pipe, publish, text

STAMP = re.compile(r"[A-Za-z0-9_-]{20,22}")


async def _all(engine: EngineService, pipe: str) -> list[Message]:
    return list((await engine.listing(ME, pipe)).messages)


async def test_the_copies_of_one_publish_share_its_stamp(engine: EngineService) -> None:
    feed = await new_feed(engine, "news", "fanout")
    pipes = [await new_pipe(engine) for _ in range(3)]
    for pipe in pipes:
        await join(engine, pipe, feed)
    assert await publish(engine, feed, msg("one")) == [3]
    copies = [await engine.read(ME, pipe.key, 1) for pipe in pipes]
    stamps = {copy.stamp for copy in copies if copy is not None}
    assert len(stamps) == 1
    assert STAMP.fullmatch(stamps.pop())


async def test_every_published_message_has_a_stamp_of_its_own(engine: EngineService) -> None:
    feed = await new_feed(engine, "news", "fanout")
    pipe, other = await new_pipe(engine), await new_pipe(engine)
    await join(engine, pipe, feed)
    await join(engine, other, feed)
    same = msg("same", persistent=True)
    await publish(engine, feed, same, same, msg("else"))  # two identical, one batch
    await publish(engine, feed, same)
    await publish(engine, feed, *[msg(str(n)) for n in range(50)])
    held = await _all(engine, pipe.key)
    stamps = [m.stamp for m in held]
    assert len(stamps) == 54
    assert len(set(stamps)) == 54
    assert all(STAMP.fullmatch(stamp) for stamp in stamps)
    assert [m.stamp for m in await _all(engine, other.key)] == stamps  # copies: the same


async def test_two_engines_never_give_the_same_stamp(make_engine: MakeEngine) -> None:
    """Two nodes of a cluster, or two runs: each engine stamps apart from every other."""
    seen: set[str] = set()
    for _ in range(2):
        engine = await make_engine()
        feed = await new_feed(engine, "news", "fanout")
        pipe = await new_pipe(engine)
        await join(engine, pipe, feed)
        await publish(engine, feed, *[msg("same") for _ in range(10)])
        stamps = {m.stamp for m in await _all(engine, pipe.key)}
        assert len(stamps) == 10
        assert not stamps & seen
        seen |= stamps


async def test_a_reader_gets_the_stamp_however_it_reads(engine: EngineService) -> None:
    feed = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed)
    await publish(engine, feed, msg("1"), msg("2"), msg("3", persistent=True))
    listed = [m.stamp for m in await _all(engine, pipe.key)]
    read = [m.stamp for p in (1, 2, 3) if (m := await engine.read(ME, pipe.key, p))]
    looked = [m.stamp for p in (1, 2, 3) if (m := await engine.look(ME, pipe.key, p))]
    cursor = engine.cursor(ME, pipe.key)
    taken = [m.stamp for m in await cursor.take(10)]
    await cursor.close()
    iterated: list[str] = []
    cursor = engine.cursor(ME, pipe.key, 1)
    async for message in cursor:
        iterated.append(message.stamp)
        if message.position == 3:
            break
    await cursor.close()
    assert len(set(listed)) == 3
    assert read == looked == taken == listed
    assert iterated == listed[1:]


async def test_persistent_messages_keep_their_stamps_across_a_restart(
    restart: MakeEngine,
) -> None:
    engine = await restart()
    feed = await new_feed(engine, "news", "fanout")
    jobs = await new_feed(engine, "jobs", "rotator")
    pipe = await new_pipe(engine)
    await join(engine, pipe, feed)
    await publish(engine, feed, msg("a", persistent=True), msg("b", persistent=True))
    await publish(engine, jobs, msg("queued", persistent=True))  # no worker yet: queued
    before = [m.stamp for m in await _all(engine, pipe.key)]
    engine = await restart(crash=True)
    assert [m.stamp for m in await _all(engine, pipe.key)] == before
    worker = await new_pipe(engine)
    await join(engine, worker, await engine.feed(ME, "jobs"))
    handed = await engine.read(ME, worker.key, 1, wait=5.0)
    assert handed is not None
    assert text(handed) == "queued"
    assert STAMP.fullmatch(handed.stamp)
    assert handed.stamp not in before
    engine = await restart()  # handed out, it is kept in the worker's pipe with its stamp
    again = await engine.read(ME, worker.key, 1)
    assert again is not None
    assert again.stamp == handed.stamp


async def test_a_redelivered_message_keeps_its_stamp(engine: EngineService) -> None:
    feed = await new_feed(engine, "news", "fanout")
    pipe = await new_pipe(engine, lease=0.05, max_deliveries=2)
    dead = await new_pipe(engine)
    await join(engine, pipe, feed)
    await join(engine, dead, await engine.feed(ME, "dead-letter"))
    await publish(engine, feed, msg("job"), msg("other"))
    first = await engine.read(ME, pipe.key, 1, lease=True)
    assert first is not None
    again = await engine.read(ME, pipe.key, 3, wait=5.0, lease=True)  # after the lease
    assert again is not None
    assert (text(again), again.redeliveries) == ("job", 1)
    assert again.stamp == first.stamp
    letter = await engine.read(ME, dead.key, 1, wait=5.0)  # after its second lease
    assert letter is not None
    assert letter.stamp == first.stamp  # the dead letter is the same message
    other = await engine.read(ME, pipe.key, 2)
    assert other is not None
    assert other.stamp != first.stamp


async def test_a_rotator_message_keeps_its_stamp_from_its_queue_to_another_worker(
    engine: EngineService,
) -> None:
    feed = await new_feed(engine, "jobs", "rotator")
    await publish(engine, feed, msg("J1"), msg("J1"))  # queued: no worker yet
    slow = await new_pipe(engine, lease=0.05)
    await join(engine, slow, feed)
    taken = await engine.read(ME, slow.key, 1, wait=5.0, lease=True)
    second = await engine.read(ME, slow.key, 2, wait=5.0)
    assert taken is not None
    assert second is not None
    assert taken.stamp != second.stamp
    fast = await new_pipe(engine)
    await join(engine, fast, feed)
    got = await engine.read(ME, fast.key, 1, wait=5.0)  # its lease ran out: another worker
    assert got is not None
    assert (text(got), got.redeliveries, got.stamp) == ("J1", 1, taken.stamp)


async def test_a_dead_letter_keeps_the_stamp(engine: EngineService) -> None:
    feed = await new_feed(engine, "news", "fanout")
    pipe, dead = await new_pipe(engine), await new_pipe(engine)
    await join(engine, pipe, feed)
    await join(engine, dead, await engine.feed(ME, "dead-letter"))
    await publish(engine, feed, msg("bad", persistent=True))
    original = await engine.read(ME, pipe.key, 1)
    assert original is not None
    assert await engine.dead_letter(ME, pipe.key, 1, "rejected")
    letter = await engine.read(ME, dead.key, 1)
    assert letter is not None
    assert letter.stamp == original.stamp


# ---------------------------------------------------------------- records without a stamp
async def test_messages_stored_before_stamps_load_with_stamps_of_their_own(
    tmp_path: Path,
) -> None:
    """A store of schema 4 (records without a stamp): each message gets one derived from
    its pipe and position, the same at every start, and keeps it once written again."""
    engine = EmbeddedEngine.open(data_dir=tmp_path, journal_interval=0.01)
    await engine.start()
    feed = await new_feed(engine, "news", "fanout")
    pipe, other = await new_pipe(engine), await new_pipe(engine)
    await join(engine, pipe, feed)
    await join(engine, other, feed)
    await publish(engine, feed, msg("a", persistent=True), msg("a", persistent=True))
    await engine.close()
    with sqlite3.connect(tmp_path / FILE_NAME) as db:  # as a schema 4 gateway wrote them
        for key, seq, data in db.execute("SELECT pipe, seq, data FROM messages").fetchall():
            fields = orjson.loads(data)
            assert len(fields) == 10
            old = orjson.dumps(fields[:7])
            db.execute("UPDATE messages SET data = ? WHERE pipe = ? AND seq = ?", (old, key, seq))
        db.execute("UPDATE meta SET value = '4' WHERE key = 'schema'")
    found: list[list[str]] = []
    for _ in range(2):
        engine = EmbeddedEngine.open(data_dir=tmp_path, journal_interval=0.01)
        await engine.start()
        found.append([m.stamp for key in (pipe.key, other.key) for m in await _all(engine, key)])
        await engine.close()
    assert found[0] == found[1]  # derived the same way each time
    assert len(set(found[0])) == 4  # apart by pipe and position
    assert all(stamp.startswith("~") and len(stamp) == 20 for stamp in found[0])
    with sqlite3.connect(tmp_path / FILE_NAME) as db:
        assert db.execute("SELECT value FROM meta WHERE key = 'schema'").fetchone() == ("5",)


def test_a_redis_entry_written_before_stamps_gets_one_from_its_pipe_and_position() -> None:
    spec = msg("a")
    old = orjson.dumps(orjson.loads(record(spec, spec.contents, "news", 1.0, None, stamp="x"))[:7])
    first = decode_message("pipe", 7, old, 10, 0, b"")
    assert first.stamp == decode_message("pipe", 7, old, 10, 0, b"").stamp
    assert first.stamp == stamp_of([], "pipe", 7)
    assert first.stamp != decode_message("pipe", 8, old, 10, 0, b"").stamp
    assert first.stamp != decode_message("other", 7, old, 10, 0, b"").stamp
    new = record(spec, spec.contents, "news", 1.0, None, stamp="Mx0DgNqP4r-_00000001")
    assert decode_message("pipe", 7, new, 10, 0, b"").stamp == "Mx0DgNqP4r-_00000001"
