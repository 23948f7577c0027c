"""The Redis master holding a pipe stopped (SIGSTOP) past the cluster's node timeout
during publishing, then resumed (SIGCONT), with real processes: three gateway nodes
on the cluster engine, the project's cluster.

A stopped master is not a dead one. Its connections stay open, so a gateway waits for
it (the link's socket timeout) instead of failing at once; the cluster marks it failed
after the node timeout, answers CLUSTERDOWN everywhere until its replica is promoted,
and then serves its slots from the replica. Resumed, it first runs the commands that
waited in its sockets, as the master it still believes it is, then learns of the
failover, turns into the new master's replica and drops what it wrote meanwhile (a
full resync). The stop here lasts past the gateways' socket timeout, so that both the
commands they gave up on and those they still wait for meet that stale master.

The clients give up on a request after CLIENT_TIMEOUT and send the same message again
(its message_id makes a repeat harmless), as clients do; the publish they gave up on
goes on in the gateway. A repeat must never be answered 200 on the strength of an
earlier publish of it that has not finished (it may yet fail), nor find copies that
publish left behind. The pipe is on a master holding neither the catalogue nor the
default feed's message-id claims, so a publish claims its id, then waits on the
stopped master, and fails while the cluster refuses every call (CLUSTERDOWN): its
claim cannot be taken back then.

Two publishers send persistent messages, a third non-persistent ones, all into the
pipe, through the nodes in turn; a reader lists the pipe all along and notes which
message each position holds (a publish's reply carries no position; the listing gives
each message's, in its href). A non-persistent message the stale master took is lost,
as docs/CLUSTER.md allows, and its position may be issued again: only positions that a
persistent message held are checked for reuse.
"""

from __future__ import annotations

import asyncio
import contextlib
import dataclasses
import os
import signal
import time
from collections.abc import Awaitable, Callable
from pathlib import Path

import aiohttp
import orjson
import pytest

from feeds.redis.catalogue import Keys
from tests.app.test_node_kill import JSON, Nodes, persistent, three_nodes
from tests.cluster_state import NODE_TIMEOUT, instance_pid, master_port, role, whole

# Alone: a master of the cluster is stopped.
pytestmark = [pytest.mark.app, pytest.mark.alone]

PUBLISHERS = 2  # of persistent messages; one more sends non-persistent ones
EACH = 40  # persistent messages a publisher sends
STOP_AFTER = 8  # answers 200 each persistent publisher has when the master is stopped
CLIENT_TIMEOUT = 2.0  # a client gives up on a request then, and sends it again
SOCKET_TIMEOUT = 5.0  # feeds/redis/link.py: a gateway gives up on a silent master then
HOLD = SOCKET_TIMEOUT + 1.0  # the least the stop lasts
PROMOTED_WITHIN = NODE_TIMEOUT + 7.0  # the replica is master (election delays included)
RESUMED_WITHIN = NODE_TIMEOUT + 6.0  # from SIGCONT to persistent publishing again
WHOLE_WITHIN = 30.0  # the cluster as it was (3 masters, a replica each) after the test
# A process of its own resumes the master this long after the stop even if this test's
# process dies meanwhile: the project's cluster is shared.
WATCHDOG = 30
PACE = 0.02  # seconds between one publisher's requests


def transient(pipe: str, name: str) -> bytes:
    """:func:`persistent`'s message without its delivery mode: not persistent."""
    document = orjson.loads(persistent(pipe, name))
    del document["restms"]["message"][0]["delivery_mode"]
    return orjson.dumps(document)


@dataclasses.dataclass
class Acked:
    """A message answered 200: when its first and its last request were sent, when the
    last was answered, and whether as a duplicate (an earlier request kept it)."""

    first: float
    last: float
    answered: float
    duplicate: bool


@dataclasses.dataclass
class Run:
    acked: dict[str, Acked] = dataclasses.field(default_factory=dict)
    held: dict[int, set[str]] = dataclasses.field(default_factory=dict)  # position -> ids
    refused: int = 0  # publishes answered 503
    abandoned: int = 0  # publishes the client gave up on
    stopped: float = 0.0
    promoted: float = 0.0
    resumed: float = 0.0  # SIGCONT
    synced: float = 0.0  # the old master a replica with its copy loaded


async def pipe_apart(http: aiohttp.ClientSession, running: Nodes) -> tuple[str, int]:
    """A new pipe whose master holds neither the catalogue nor the default feed's
    message-id claims, and that master's port."""
    keys = Keys(running.namespace)
    others = {await master_port(keys.cat), await master_port(keys.dedup("default", "any"))}
    for _ in range(40):  # at least a third of the pipes land there
        async with http.post(
            running.urls[0] + "/restms/domain/default",
            data=b'{"restms":{"pipe":[{}]}}',
            headers=JSON,
        ) as r:
            assert r.status == 201, await r.text()
            pipe = str(orjson.loads(await r.read())["restms"]["pipe"][0]["name"])
        port = await master_port(keys.pipe(pipe)[2])
        if port not in others:
            return pipe, port
    raise AssertionError("no pipe of 40 landed apart from the catalogue and the claims")


async def until(check: Callable[[], Awaitable[bool]], what: str, within: float) -> float:
    """Poll ``check`` until it is true; when it became true."""
    deadline = time.monotonic() + within
    while not await check():
        assert time.monotonic() < deadline, f"not within {within} s: {what}"
        await asyncio.sleep(0.05)
    return time.monotonic()


def position(message: dict[str, str]) -> int:
    return int(message["href"].rsplit(".", 1)[1])


async def test_a_master_stopped_and_resumed_reuses_no_position(tmp_path: Path) -> None:
    async with (
        three_nodes(tmp_path) as running,
        aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=CLIENT_TIMEOUT)) as http,
    ):
        urls = running.urls
        pipe, port = await pipe_apart(http, running)
        pid = instance_pid(port)
        replica = int((await role(port))[2][0][1])
        run = Run()
        stop = asyncio.Event()
        done = asyncio.Event()

        async def publish(k: int, kept: bool) -> None:
            turn = k
            for i in range(EACH if kept else 10**6):
                if not kept and done.is_set():
                    return
                name = f"{'p' if kept else 'n'}{k}-{i}"
                body = persistent(pipe, name) if kept else transient(pipe, name)
                first = time.monotonic()
                while True:
                    url = urls[turn % len(urls)]
                    turn += 1
                    sent = time.monotonic()
                    try:
                        async with http.post(
                            url + "/restms/feed/default", data=body, headers=JSON
                        ) as r:
                            text = await r.text()
                    except TimeoutError:
                        run.abandoned += 1
                        continue
                    if r.status == 200:
                        answered = time.monotonic()
                        run.acked[name] = Acked(first, sent, answered, '"duplicate"' in text)
                        break
                    assert r.status == 503, text  # refused, never lied
                    assert "Retry-After" in r.headers
                    run.refused += 1
                    await asyncio.sleep(PACE)
                if kept and len(run.acked) >= (PUBLISHERS + 1) * STOP_AFTER:
                    stop.set()
                await asyncio.sleep(PACE)

        async def read() -> None:
            turn = 0
            while not done.is_set():
                url = urls[turn % len(urls)]
                turn += 1
                try:
                    async with http.get(url + f"/restms/resource/{pipe}", headers=JSON) as r:
                        if r.status == 503:
                            continue
                        assert r.status == 200, await r.text()
                        listing = orjson.loads(await r.read())["restms"]["pipe"][0]
                except TimeoutError:
                    continue
                for message in listing.get("message", []):
                    if message.get("async") != "1":
                        run.held.setdefault(position(message), set()).add(message["message_id"])
                await asyncio.sleep(0.05)

        async def promoted() -> bool:
            return bool((await role(replica))[0] == b"master")

        async def synced() -> bool:
            with contextlib.suppress(OSError, TimeoutError):
                now = await role(port)
                return now[0] == b"slave" and now[3] == b"connected"
            return False

        async def stop_and_resume() -> None:
            await stop.wait()
            watchdog = await asyncio.create_subprocess_exec(
                "sh", "-c", f"sleep {WATCHDOG}; kill -CONT {pid}"
            )
            os.kill(pid, signal.SIGSTOP)
            run.stopped = time.monotonic()
            try:
                run.promoted = await until(promoted, "the replica promoted", PROMOTED_WITHIN)
                await asyncio.sleep(max(0.0, run.stopped + HOLD - time.monotonic()))
            finally:
                os.kill(pid, signal.SIGCONT)  # never left stopped, whatever failed
                run.resumed = time.monotonic()
                watchdog.kill()
                await watchdog.wait()
            run.synced = await until(synced, "the old master a synced replica", RESUMED_WITHIN)
            done.set()

        async with asyncio.timeout(90):
            stopping = asyncio.create_task(stop_and_resume())
            reader = asyncio.create_task(read())
            try:
                await asyncio.gather(
                    *(publish(k, True) for k in range(PUBLISHERS)),
                    publish(PUBLISHERS, False),
                    stopping,
                )
            finally:
                done.set()
                if not stopping.done():
                    stopping.cancel()
                    with contextlib.suppress(asyncio.CancelledError):
                        await stopping
                await reader
            async with http.get(urls[1] + f"/restms/resource/{pipe}", headers=JSON) as r:
                assert r.status == 200
                listing = orjson.loads(await r.read())["restms"]["pipe"][0]
            await until(whole, "the cluster whole again", WHOLE_WITHIN)

    final = {position(m): m["message_id"] for m in listing["message"] if m.get("async") != "1"}
    for at, name in final.items():
        run.held.setdefault(at, set()).add(name)
    # No position held a persistent message and another one, as the reader saw the
    # pipe all along.
    reused = {
        at: names
        for at, names in run.held.items()
        if len(names) > 1 and any(name.startswith("p") for name in names)
    }
    assert not reused, f"positions given to two messages: {reused}"
    # Every persistent message answered 200 (a duplicate's answer included) is there
    # once, in the order each publisher sent them, and after any message answered
    # before it was first sent.
    where = {name: at for at, name in final.items()}
    kept = {name: acked for name, acked in run.acked.items() if name.startswith("p")}
    assert len(kept) == PUBLISHERS * EACH
    lost = sorted(name for name in kept if name not in where)
    assert not lost, f"answered 200, never kept: {lost}"
    twice = {name: [at for at, held in final.items() if held == name] for name in kept}
    twice = {name: where for name, where in twice.items() if len(where) > 1}
    assert not twice, f"a persistent message held twice (at these positions): {twice}"
    for k in range(PUBLISHERS):
        mine = [where[f"p{k}-{i}"] for i in range(EACH)]
        assert mine == sorted(mine), f"publisher {k}: out of order {mine}"
    for first, a in kept.items():
        for then, b in kept.items():
            if a.answered < b.first:
                assert where[first] < where[then], f"{then} placed before {first}"
    assert run.refused + run.abandoned, "the stop refused nothing: it missed the pipe's shard"
    # Persistent publishing resumed once the old master was a synced replica again.
    after = [a.answered for a in kept.values() if a.last > run.resumed and not a.duplicate]
    assert after, "no persistent message was published after the master resumed"
    resumed = min(after) - run.resumed
    assert resumed <= RESUMED_WITHIN, (
        f"persistent publishing resumed {resumed:.1f} s after SIGCONT (replica promoted"
        f" {run.promoted - run.stopped:.1f} s after SIGSTOP, old master synced"
        f" {run.synced - run.resumed:.1f} s after SIGCONT)"
    )
