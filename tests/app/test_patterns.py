"""End-to-end messaging patterns of digest §7, driven with plain HTTP requests.

* Housecat (§7.1): addressed delivery through the default feed, its negative checks,
  reverse request/reply through a service feed and ``reply_to``, and the decoupled
  variant on a direct feed.
* Wolfpack (§7.2, F8, P3, P8, Q1): workers with one pipe each on a rotator or service
  feed, running as concurrent asyncio tasks. Every job must be acknowledged by exactly
  one worker, none lost and none duplicated, also when a worker's pipe is deleted
  while it holds unacknowledged jobs.
* Parrot (§7.3): topic pub/sub exactly as the recipe lists it, then fanout, headers
  and a late subscriber.
"""

from __future__ import annotations

import asyncio
from collections import Counter
from dataclasses import dataclass, field
from typing import Any

import pytest
from lxml import etree

from tests.app.jsonapi import DOMAIN, delete, get, join, new_pipe, post, publish
from tests.conftest import Gateway, MakeGateway

XML = "application/restms+xml"
DEFAULT_FEED = "/restms/feed/default"
NS = "http://www.restms.org/schema/restms"
JOBS = 60


# ---------------------------------------------------------------- helpers


async def pipe_messages(gw: Gateway, pipe: dict[str, Any]) -> list[dict[str, Any]] | None:
    """The pipe's listing (held messages, then the asynclet), or None once it is gone."""
    status, reply = await get(gw, pipe["uri"])
    if status == 404:
        return None
    assert status == 200, reply
    return list(reply["restms"]["pipe"][0].get("message", []))


def held(items: list[dict[str, Any]]) -> list[dict[str, Any]]:
    return [m for m in items if m.get("async") != "1"]


async def recv(gw: Gateway, pipe: dict[str, Any]) -> dict[str, Any]:
    """§7 "recv": GET the oldest held message or the asynclet, then DELETE it."""
    items = await pipe_messages(gw, pipe)
    assert items is not None
    href = items[0]["href"]
    async with asyncio.timeout(2):
        status, reply = await get(gw, href)
    assert status == 200, reply
    assert await delete(gw, href) == 200
    return dict(reply["restms"]["message"][0])


def text(message: dict[str, Any]) -> str:
    return str(message["content"][0]["value"])


async def addresses(gw: Gateway, pipe: dict[str, Any]) -> list[str]:
    items = await pipe_messages(gw, pipe)
    assert items is not None
    return [m["address"] for m in held(items)]


# ---------------------------------------------------------------- Housecat (§7.1)
async def test_housecat_addressed_delivery_through_the_default_feed(gw: Gateway) -> None:
    # 1. Discovery.
    status, reply = await get(gw, DOMAIN)
    assert status == 200
    domain = reply["restms"]["domain"][0]
    assert "3/Defaults" in [p["name"] for p in domain["profile"]]
    assert "default" in [f["name"] for f in domain["feed"]]
    # 2. The cat's pipe: its default join and one asynclet.
    cat = await new_pipe(gw)
    (default_join,) = cat["join"]
    assert default_join["feed"] == gw.uri(DEFAULT_FEED)
    assert default_join["address"] == cat["name"]
    (asynclet,) = cat["message"]
    assert asynclet["async"] == "1"
    # 3. The master publishes to the cat's name.
    xml = (
        f'<restms xmlns="{NS}"><message address="{cat["name"]}">'
        '<content type="text/plain" encoding="plain">ping</content></message></restms>'
    )
    async with gw.http.post(DEFAULT_FEED, data=xml, headers={"Content-Type": XML}) as r:
        assert r.status == 200
        (count,) = etree.fromstring(await r.read())
        assert count.attrib == {"count": "1"}
    # 4. The cat receives, deletes, and sees a fresh asynclet.
    async with asyncio.timeout(2):
        status, reply = await get(gw, asynclet["href"])
    assert status == 200
    message = reply["restms"]["message"][0]
    assert message["address"] == cat["name"]
    assert text(message) == "ping"
    assert await delete(gw, asynclet["href"]) == 200
    assert (await get(gw, asynclet["href"]))[0] == 404
    items = await pipe_messages(gw, cat)
    assert items is not None
    assert held(items) == []
    assert [m["async"] for m in items] == ["1"]
    assert items[0]["href"] != asynclet["href"]
    # 5. Negative checks.
    assert await publish(gw, DEFAULT_FEED, {"address": "nobody"}) == [0]
    status, _, _ = await post(gw, cat["uri"], join=[{"feed": DEFAULT_FEED, "address": "x"}])
    assert status == 403
    assert await delete(gw, default_join["href"]) == 403
    assert await publish(gw, DEFAULT_FEED, {"address": cat["name"]}) == [1]


async def test_housecat_reverse_request_reply_through_a_service_feed(gw: Gateway) -> None:
    status, _, service = await post(gw, DOMAIN, feed=[{"name": "adder", "type": "service"}])
    assert status == 201
    worker = await new_pipe(gw, "ondemand")
    await join(gw, worker, service)
    requestor = await new_pipe(gw)

    async def serve(requests: int) -> None:
        for _ in range(requests):
            request = await recv(gw, worker)
            a, b = (int(x) for x in text(request).split("+"))
            reply = {
                "address": request["reply_to"],
                "correlation_id": request["message_id"],
                "content": [{"type": "text/plain", "value": str(a + b)}],
            }
            assert await publish(gw, DEFAULT_FEED, reply) == [1]

    async with asyncio.timeout(10):
        server = asyncio.create_task(serve(2))
        for i, (question, expected) in enumerate([("2+2", "4"), ("40+2", "42")]):
            request = {
                "message_id": f"req-{i}",
                "reply_to": requestor["name"],
                "content": [{"type": "text/plain", "value": question}],
            }
            assert await publish(gw, service, request) in ([0], [1])
            answer = await recv(gw, requestor)
            assert answer["address"] == requestor["name"]
            assert answer["correlation_id"] == f"req-{i}"
            assert text(answer) == expected
        await server


async def test_housecat_decoupled_variant_on_a_direct_feed(gw: Gateway) -> None:
    status, _, mail = await post(gw, DOMAIN, feed=[{"name": "mail", "type": "direct"}])
    assert status == 201
    bob1, bob2, alice = await new_pipe(gw), await new_pipe(gw), await new_pipe(gw)
    await join(gw, bob1, mail, "bob")
    await join(gw, bob2, mail, "bob")
    await join(gw, alice, mail, "alice")
    letter = {"address": "bob", "content": [{"type": "text/plain", "value": "hi bob"}]}
    assert await publish(gw, mail, letter) == [2]
    assert text(await recv(gw, bob1)) == "hi bob"
    assert text(await recv(gw, bob2)) == "hi bob"
    assert await addresses(gw, alice) == []


# ---------------------------------------------------------------- Wolfpack (§7.2)
@dataclass
class Tally:
    """Who saw (GET) and who acknowledged (DELETE) which job."""

    total: int
    seen: dict[str, list[str]] = field(default_factory=dict)
    acked: dict[str, list[str]] = field(default_factory=dict)
    done: asyncio.Event = field(default_factory=asyncio.Event)

    def saw(self, worker: str, job: str) -> None:
        self.seen.setdefault(worker, []).append(job)

    def ack(self, worker: str, job: str) -> None:
        self.acked.setdefault(worker, []).append(job)
        if len({j for jobs in self.acked.values() for j in jobs}) >= self.total:
            self.done.set()

    def acked_jobs(self) -> Counter[str]:
        return Counter(j for jobs in self.acked.values() for j in jobs)


async def work(gw: Gateway, name: str, pipe: dict[str, Any], tally: Tally) -> None:
    """A worker: read the pipe, GET each held message or the asynclet, DELETE it."""
    for _ in range(10 * JOBS):
        if tally.done.is_set():
            return
        items = await pipe_messages(gw, pipe)
        if items is None:
            return
        for item in held(items) or items:
            status, reply = await get(gw, item["href"])
            if status != 200:  # 503: the wait expired (idle); 404: the pipe went
                break
            job = reply["restms"]["message"][0]["message_id"]
            tally.saw(name, job)
            assert await delete(gw, item["href"]) == 200
            tally.ack(name, job)
    raise AssertionError(f"worker {name} ran out of iterations")


async def hold(gw: Gateway, pipe: dict[str, Any], name: str, tally: Tally, most: int) -> None:
    """A worker that dies: it GETs up to ``most`` jobs and never acknowledges them."""
    items = await pipe_messages(gw, pipe)
    assert items is not None
    for item in (held(items) or items)[:most]:
        status, reply = await get(gw, item["href"])
        assert status == 200, reply
        tally.saw(name, reply["restms"]["message"][0]["message_id"])


@pytest.mark.parametrize("dies", [False, True], ids=["all-live", "one-dies"])
@pytest.mark.parametrize("pipe_type", ["", "ondemand"], ids=["default-pipes", "ondemand-pipes"])
@pytest.mark.parametrize("feed_type", ["rotator", "service"])
async def test_wolfpack_P8_every_job_reaches_exactly_one_worker(
    make_gateway: MakeGateway, feed_type: str, pipe_type: str, dies: bool
) -> None:
    gw = await make_gateway(max_wait=0.3)
    status, _, jobs = await post(gw, DOMAIN, feed=[{"name": "jobs", "type": feed_type}])
    assert status == 201
    again = await post(gw, DOMAIN, feed=[{"name": "jobs", "type": feed_type}])
    assert again[::2] == (200, jobs)
    pipes = [await new_pipe(gw, pipe_type) for _ in range(3)]
    for pipe in pipes:
        await join(gw, pipe, jobs)
    tally = Tally(total=JOBS)
    live = pipes[:2] if dies else pipes
    async with asyncio.timeout(20):
        workers = [
            asyncio.create_task(work(gw, f"W{i + 1}", pipe, tally)) for i, pipe in enumerate(live)
        ]
        if dies and pipe_type == "ondemand":
            # W3 asks for one job (its GET pulls it), then dies holding it.
            dying = asyncio.create_task(hold(gw, pipes[2], "W3", tally, 1))
        counts = []
        for i in range(JOBS):
            counts.extend(await publish(gw, jobs, {"message_id": f"J{i}"}))
            if i % 10 == 9:
                await asyncio.sleep(0)  # let the workers interleave with the publisher
        assert all(c in (0, 1) for c in counts)
        if pipe_type == "":
            assert counts == [1] * JOBS  # default pipes take every job at once
        if dies:
            if pipe_type == "":
                await hold(gw, pipes[2], "W3", tally, JOBS)
            else:
                await dying
            assert tally.seen.get("W3"), "the dying worker should have held a job"
            assert await delete(gw, pipes[2]["uri"]) == 200
        await tally.done.wait()
        for task in workers:
            await task
    acked = tally.acked_jobs()
    assert set(acked) == {f"J{i}" for i in range(JOBS)}  # none lost
    assert max(acked.values()) == 1  # none duplicated
    if dies:
        assert "W3" not in tally.acked
    for worker, jobs_seen in tally.seen.items():
        if worker != "W3" or not dies:
            assert Counter(jobs_seen) == Counter(tally.acked[worker])
    # The dead worker's jobs reached a live worker.
    for job in tally.seen.get("W3", []) if dies else []:
        assert acked[job] == 1
    if pipe_type == "" and not dies:
        assert sorted(len(v) for v in tally.acked.values()) == [JOBS // 3] * 3
    # Nothing is left over anywhere: not in the pipes, not queued on the feed.
    for pipe in live:
        items = await pipe_messages(gw, pipe)
        assert items is not None
        assert held(items) == []
    probe = await new_pipe(gw)
    await join(gw, probe, jobs)
    assert await addresses(gw, probe) == []


async def test_wolfpack_round_robin_queueing_and_wolf_call(gw: Gateway) -> None:
    # 1. Create, and again with the same Location.
    status, _, jobs = await post(gw, DOMAIN, feed=[{"name": "jobs", "type": "service"}])
    assert status == 201
    assert (await post(gw, DOMAIN, feed=[{"name": "jobs", "type": "service"}]))[::2] == (
        200,
        jobs,
    )
    # 2-3. Two default-pipe workers, J1..J4 round robin.
    w1, w2 = await new_pipe(gw), await new_pipe(gw)
    j1 = await join(gw, w1, jobs)
    j2 = await join(gw, w2, jobs)
    counts = [c for i in range(1, 5) for c in await publish(gw, jobs, {"message_id": f"J{i}"})]
    assert counts == [1, 1, 1, 1]

    async def job_ids(pipe: dict[str, Any]) -> list[str]:
        items = await pipe_messages(gw, pipe)
        assert items is not None
        return [m["message_id"] for m in held(items)]

    assert await job_ids(w1) == ["J1", "J3"]
    assert await job_ids(w2) == ["J2", "J4"]
    # 5. Queueing on a rotator with no joins, delivered when W1 joins.
    status, _, rotator = await post(gw, DOMAIN, feed=[{"name": "spare", "type": "rotator"}])
    assert status == 201
    assert await publish(gw, rotator, {"message_id": "J5"}) == [0]
    await join(gw, w1, rotator)
    assert await job_ids(w1) == ["J1", "J3", "J5"]
    # 6. Wolf Call: up while joined, gone after both joins went.
    assert (await get(gw, jobs))[0] == 200
    assert await delete(gw, j1) == 200
    assert (await get(gw, jobs))[0] == 200
    assert await delete(gw, j2) == 200
    assert (await get(gw, jobs))[0] == 404
    assert (await post(gw, jobs, message=[{"message_id": "J6"}]))[0] == 404
    # 7. An ondemand pipe cannot join a topic feed.
    status, _, topic = await post(gw, DOMAIN, feed=[{"name": "t", "type": "topic"}])
    assert status == 201
    ondemand = await new_pipe(gw, "ondemand")
    assert (await post(gw, ondemand["uri"], join=[{"feed": topic}]))[0] == 403


async def test_wolfpack_ondemand_listing_shows_at_most_one_message(gw: Gateway) -> None:
    status, _, jobs = await post(gw, DOMAIN, feed=[{"name": "od", "type": "rotator"}])
    assert status == 201
    worker = await new_pipe(gw, "ondemand")
    await join(gw, worker, jobs)
    await publish(gw, jobs, *({"message_id": f"J{i}"} for i in range(5)))
    for i in range(5):
        items = await pipe_messages(gw, worker)
        assert items is not None
        assert held(items) == []
        got = await recv(gw, worker)
        assert got["message_id"] == f"J{i}"


# ---------------------------------------------------------------- Parrot (§7.3)
async def test_parrot_topic_pub_sub_as_the_recipe_lists_it(gw: Gateway) -> None:
    status, _, news = await post(gw, DOMAIN, feed=[{"name": "news", "type": "topic"}])
    assert status == 201
    s1, s2, s3 = await new_pipe(gw), await new_pipe(gw), await new_pipe(gw)
    await join(gw, s1, news, "rec.pets.*")
    await join(gw, s2, news, "rec.#")
    await join(gw, s3, news, "rec.cars")
    published = ["rec.pets.dogs", "rec.cars", "rec.pets.cats", "rec.pets", "rec.pets.cats.tabby"]
    counts = [c for a in published for c in await publish(gw, news, {"address": a})]
    assert counts == [2, 2, 2, 1, 1]
    assert await addresses(gw, s1) == ["rec.pets.dogs", "rec.pets.cats"]
    assert await addresses(gw, s2) == published
    assert await addresses(gw, s3) == ["rec.cars"]
    # Receiving works like any pipe: S2 reads all five in publish order.
    assert [(await recv(gw, s2))["address"] for _ in published] == published
    # 5. A late subscriber gets nothing published before it joined.
    s4 = await new_pipe(gw)
    await join(gw, s4, news, "#")
    assert await addresses(gw, s4) == []
    assert await publish(gw, news, {"address": "rec.new"}) == [2]
    assert await addresses(gw, s4) == ["rec.new"]


async def test_parrot_fanout_and_headers_feeds(gw: Gateway) -> None:
    status, _, fan = await post(gw, DOMAIN, feed=[{"name": "all", "type": "fanout"}])
    assert status == 201
    subscribers = [await new_pipe(gw) for _ in range(3)]
    for s, address in zip(subscribers, ["rec.cars", "", "whatever"], strict=True):
        await join(gw, s, fan, address)
    published = ["rec.pets.dogs", "x", ""]
    assert [c for a in published for c in await publish(gw, fan, {"address": a})] == [3, 3, 3]
    for s in subscribers:
        assert await addresses(gw, s) == published

    status, _, hdr = await post(gw, DOMAIN, feed=[{"name": "regional", "type": "headers"}])
    assert status == 201
    eu = await new_pipe(gw)
    await join(gw, eu, hdr, "", {"region": "eu"})

    def regional(address: str, region: str | None) -> dict[str, Any]:
        message: dict[str, Any] = {"address": address}
        if region is not None:
            message["header"] = [{"name": "region", "value": region}]
        return message

    counts = await publish(
        gw, hdr, regional("a", "eu"), regional("b", "us"), regional("c", None), regional("d", "eu")
    )
    assert counts == [1, 0, 0, 1]
    assert await addresses(gw, eu) == ["a", "d"]
