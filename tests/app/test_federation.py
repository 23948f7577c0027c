"""Federation between separate gateways, each in a process of its own (tests/sites.py):
loops end, diamonds deliver once, pull links resume their remote pipe, and a gateway
killed with SIGKILL on either side of a link loses and repeats nothing (and, the
remote killed, changes no order).

Every site's reader pipe is joined to its ``news`` feed with ``#``, so it holds each
message that reached that feed once: a repeat would show as a second copy.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from tests.sites import Client, Link, content, sites

QUIET = 2.0  # seconds the sites are watched after delivery: nothing more may arrive
# The origin is killed once this many messages were acknowledged to its publisher, who
# publishes two a request and at most MAX_BATCHES requests: fewer than a pipe listing
# shows (listing_cap, 1,000), so the reader sees every message the remote holds.
KILL_AFTER = 100
MAX_BATCHES = 300
WITHIN = 20.0  # seconds a message may take to reach every site (links retry from 0.1 s)


def messages(tag: str, count: int = 2) -> list[dict[str, Any]]:
    """``count`` persistent messages, the first with a message_id, the others without
    (those get one from their origin)."""
    made = []
    for i in range(count):
        message: dict[str, Any] = {
            "address": f"news.{tag}",
            "delivery_mode": "2",
            "content": [{"value": f"{tag}-{i}"}],
        }
        if i == 0:
            message["message_id"] = f"{tag}-id"
        made.append(message)
    return made


async def settled(client: Client, pipes: dict[str, str], want: int) -> dict[str, list[str]]:
    """Each pipe's contents once every pipe holds ``want`` messages, and again after
    :data:`QUIET` seconds (nothing more may have come)."""
    got = {}
    for name, pipe in pipes.items():
        got[name] = [content(m) for m in await client.wait_for(pipe, want, WITHIN)]
    await asyncio.sleep(QUIET)
    for name, pipe in pipes.items():
        again = [content(m) for m in await client.held(pipe)]
        assert again == got[name], (name, got[name], again)
    return got


def both_ways(*pairs: tuple[str, str], max_hops: int) -> list[Link]:
    return [
        link
        for a, b in pairs
        for link in (Link(a, b, max_hops=max_hops), Link(b, a, max_hops=max_hops))
    ]


@pytest.fixture
async def client() -> Any:
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=30)) as http:
        yield Client(http)


async def test_a_ring_federated_both_ways_delivers_once_everywhere_and_goes_quiet(
    tmp_path: Path, client: Client
) -> None:
    # max_hops 3: enough to go round the ring, so only the trail ends the loop
    links = both_ways(("A", "B"), ("B", "C"), ("C", "A"), max_hops=3)
    async with sites(tmp_path, "ABC", links) as running:
        pipes = {name: await client.reader(site) for name, site in running.items()}
        await client.publish(running["A"], messages("ring"))
        got = await settled(client, pipes, 2)
        for name in "ABC":
            assert Counter(got[name]) == Counter(["ring-0", "ring-1"]), (name, got)
        counted = [await client.counters(site) for site in running.values()]
        looped = sum(
            v for each in counted for (counter, _), v in each.items() if counter == "looped"
        )
        assert looped > 0  # the trail stopped copies that would have gone round
        before = {name: await client.counters(site) for name, site in running.items()}
        await asyncio.sleep(QUIET)
        after = {name: await client.counters(site) for name, site in running.items()}
        assert before == after  # nothing keeps circulating


async def test_a_diamond_delivers_once_at_its_far_end(tmp_path: Path, client: Client) -> None:
    links = [
        Link("A", "B", max_hops=2),
        Link("A", "C", max_hops=2),
        Link("B", "D", max_hops=2),
        Link("C", "D", max_hops=2),
    ]
    async with sites(tmp_path, "ABCD", links) as running:
        pipes = {name: await client.reader(site) for name, site in running.items()}
        await client.publish(running["A"], messages("diamond", 3))
        got = await settled(client, pipes, 3)
        for name in "ABCD":
            assert sorted(got[name]) == ["diamond-0", "diamond-1", "diamond-2"], (name, got)
        d = await client.counters(running["D"])
        b = await client.counters(running["B"])
        c = await client.counters(running["C"])
        # D was offered each message twice (through B and through C): one was a repeat
        sent_to_d = b[("sent", "out-D")] + c[("sent", "out-D")]
        repeats = b[("remote_duplicates", "out-D")] + c[("remote_duplicates", "out-D")]
        assert (sent_to_d, repeats) == (3, 3), (b, c, d)


async def test_max_hops_one_sends_only_what_was_published_here(
    tmp_path: Path, client: Client
) -> None:
    links = [Link("A", "B"), Link("B", "C")]
    async with sites(tmp_path, "ABC", links) as running:
        pipes = {name: await client.reader(site) for name, site in running.items()}
        await client.publish(running["A"], messages("hop"))
        await client.publish(running["B"], messages("local"))
        got = await settled(client, {"B": pipes["B"]}, 4)
        assert sorted(got["B"]) == ["hop-0", "hop-1", "local-0", "local-1"]
        got = await settled(client, {"C": pipes["C"]}, 2)
        assert sorted(got["C"]) == ["local-0", "local-1"]  # A's went one hop, no further


async def test_a_pull_link_reads_its_remote_pipe_and_resumes_it_after_a_restart(
    tmp_path: Path, client: Client
) -> None:
    async with sites(tmp_path, "AB", [Link("B", "A", direction="in")]) as running:
        a, b = running["A"], running["B"]
        pipe = await client.reader(b)
        await client.publish(a, messages("first", 3))
        got = await client.wait_for(pipe, 3, WITHIN)
        assert sorted(content(m) for m in got) == ["first-0", "first-1", "first-2"]
        await b.stop()
        await client.publish(a, messages("while-away", 3))  # held in B's pipe on A
        await b.start()
        got = await client.wait_for(pipe, 6, WITHIN)
        await asyncio.sleep(QUIET)
        got = await client.held(pipe)
        assert sorted(content(m) for m in got) == sorted(
            ["first-0", "first-1", "first-2", "while-away-0", "while-away-1", "while-away-2"]
        )
        feeds = [m.get("feed", "") for m in got]
        assert all(f.startswith(b.url) for f in feeds), feeds


async def test_a_remote_killed_during_traffic_gets_every_message_once(
    tmp_path: Path, client: Client
) -> None:
    async with sites(tmp_path, "AB", [Link("A", "B")]) as running:
        a, b = running["A"], running["B"]
        pipe = await client.reader(b)
        sent: list[str] = []

        async def publish(count: int, tag: str) -> None:
            for i in range(count):
                batch = messages(f"{tag}{i}", 2)
                await client.publish(a, batch)
                sent.extend(str(m["content"][0]["value"]) for m in batch)
                await asyncio.sleep(0.01)

        publishing = asyncio.create_task(publish(60, "k"))
        await asyncio.sleep(0.4)
        await b.stop(kill=True)
        await asyncio.sleep(0.5)
        await b.start()
        await publishing
        got = await client.wait_for(pipe, len(sent), WITHIN)
        await asyncio.sleep(QUIET)
        got = await client.held(pipe)
        assert Counter(content(m) for m in got) == Counter(sent)
        # in the order published: a batch goes only after the one before was answered
        assert [content(m) for m in got] == sent


async def test_an_origin_killed_during_traffic_loses_and_repeats_nothing(
    tmp_path: Path, client: Client
) -> None:
    async with sites(tmp_path, "AB", [Link("A", "B", extra=(("batch", 5),))]) as running:
        a, b = running["A"], running["B"]
        pipe = await client.reader(b)
        acknowledged: list[str] = []
        enough = asyncio.Event()

        async def publish() -> None:
            for i in range(MAX_BATCHES):
                batch = messages(f"o{i}", 2)
                try:
                    await client.publish(a, batch)
                except (aiohttp.ClientError, AssertionError):
                    return  # killed: what had no answer may or may not be there
                acknowledged.extend(str(m["content"][0]["value"]) for m in batch)
                if len(acknowledged) >= KILL_AFTER:
                    enough.set()

        publishing = asyncio.create_task(publish())
        async with asyncio.timeout(WITHIN):
            await enough.wait()
        await a.stop(kill=True)
        await publishing
        await a.start()
        got = await client.wait_for(pipe, len(acknowledged), WITHIN)
        await asyncio.sleep(QUIET)
        got = await client.held(pipe)
        held = Counter(content(m) for m in got)
        assert all(held[m] == 1 for m in acknowledged), [m for m in acknowledged if held[m] != 1]
        assert max(held.values()) == 1  # nothing twice, answered or not
        assert len(acknowledged) >= KILL_AFTER
