"""Benchmark: the client library against raw requests, in the same run.

What the library costs its user, on one gateway (``main.py serve``, embedded
engine, memory store defaults) on 127.0.0.1, from one client process on one event
loop, in rounds that take turns (library, raw httpx2, raw aiohttp) so that the
machine's noise falls on all three alike:

* **batched publish throughput**: 4 concurrent publishers, each posting
  ``--requests`` batches of 100 messages (1 KiB of text each) to a fanout feed with
  one pipe joined (purged between rounds); messages per second. The library sets a
  ``message_id`` per message and an ``Idempotency-Key`` per request and reads the
  reply into a value; the raw clients build the same JSON document with the same ids
  and key by hand (``json.dumps``) and check the status, so the gateway does the same
  work for all three and the difference is the library's.
* **delivery latency**: one message at a time, published (raw, the same for all)
  after the reader has asked for it; from just before the publish to the moment the
  reader holds the message, then acknowledged. The library reads with
  ``messages(pipe, auto_ack=True)``; the raw readers GET the asynclet, DELETE it, and
  GET the next position.

Ratios are library / raw of the medians of the rounds (throughput: below 1 is
slower; latency: above 1 is slower). Results go to bench/results/client.json.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import secrets
import statistics
import time
from typing import Any

import aiohttp
import httpx2

from bench.common import JSON, RESULTS, Server, log, machine, payload, percentile
from restms_client import AsyncClient, Message

BATCH = 100
PUBLISHERS = 4


def _raw_batch() -> tuple[bytes, dict[str, str]]:
    """What the library sends, made by hand: the document with a message_id per
    message, and the request's headers with an Idempotency-Key."""
    text = payload()
    stem = secrets.token_hex(16)
    messages = [
        {
            "address": "",
            "message_id": f"{stem}.{i}",
            "content": [{"type": "text/plain", "encoding": "plain", "value": text}],
        }
        for i in range(BATCH)
    ]
    headers = {"Content-Type": JSON, "Accept": JSON, "Idempotency-Key": secrets.token_hex(16)}
    return json.dumps({"restms": {"message": messages}}).encode(), headers


# ---------------------------------------------------------------- throughput
async def _publish_library(client: AsyncClient, feed: str, requests: int) -> None:
    batch = [Message.of(payload()) for _ in range(BATCH)]
    for _ in range(requests):
        reply = await client.publish(feed, batch)
        if reply.counts[0] != 1:
            raise RuntimeError(f"publish reached {reply.counts[0]} pipes")


async def _publish_httpx(http: httpx2.AsyncClient, feed: str, requests: int) -> None:
    for _ in range(requests):
        body, headers = _raw_batch()
        reply = await http.post(feed, content=body, headers=headers)
        if reply.status_code != 200:
            raise RuntimeError(f"publish: {reply.status_code} {reply.text[:200]}")


async def _publish_aiohttp(http: aiohttp.ClientSession, feed: str, requests: int) -> None:
    for _ in range(requests):
        body, headers = _raw_batch()
        async with http.post(feed, data=body, headers=headers) as reply:
            await reply.read()
            if reply.status != 200:
                raise RuntimeError(f"publish: {reply.status}")


async def throughput(
    kind: str, sessions: dict[str, Any], feed: str, requests: int
) -> tuple[float, float]:
    """Messages a second, and this process's CPU-µs a message."""
    session = sessions[kind]
    publish = {"library": _publish_library, "httpx2": _publish_httpx, "aiohttp": _publish_aiohttp}
    started, cpu = time.perf_counter(), time.process_time()
    await asyncio.gather(*(publish[kind](session, feed, requests) for _ in range(PUBLISHERS)))
    messages = PUBLISHERS * requests * BATCH
    elapsed, spent = time.perf_counter() - started, time.process_time() - cpu
    return messages / elapsed, spent / messages * 1e6


# ---------------------------------------------------------------- latency
class Clock:
    """Hands the reader the time each message was published (by its text)."""

    def __init__(self) -> None:
        self.sent: dict[str, float] = {}
        self.samples: list[float] = []
        self.got = asyncio.Event()
        self.cpu_us = 0.0  # this process's CPU a message (reader and publisher)

    def received(self, text: str) -> None:
        self.samples.append((time.perf_counter() - self.sent.pop(text)) * 1000)
        self.got.set()


async def _read_library(client: AsyncClient, pipe: str, count: int, clock: Clock) -> None:
    async with client.messages(pipe, auto_ack=True) as messages:
        async for message in messages:
            clock.received(message.text)
            if len(clock.samples) == count:
                await message.ack()
                return


async def _read_httpx(http: httpx2.AsyncClient, pipe: str, count: int, clock: Clock) -> None:
    listing = (await http.get(pipe, headers={"Accept": JSON})).json()["restms"]["pipe"][0]
    asynclet = next(m["href"] for m in listing["message"] if m.get("async") == "1")
    prefix, _, position = asynclet.rpartition(".")
    n = int(position)
    while len(clock.samples) < count:
        reply = await http.get(f"{prefix}.{n}", headers={"Accept": JSON}, timeout=60)
        document = reply.json()["restms"]["message"][0]
        clock.received(document["content"][0]["value"])
        await http.delete(f"{prefix}.{n}")
        n += 1


async def _read_aiohttp(http: aiohttp.ClientSession, pipe: str, count: int, clock: Clock) -> None:
    async with http.get(pipe, headers={"Accept": JSON}) as reply:
        listing = (await reply.json(content_type=None))["restms"]["pipe"][0]
    asynclet = next(m["href"] for m in listing["message"] if m.get("async") == "1")
    prefix, _, position = asynclet.rpartition(".")
    n = int(position)
    while len(clock.samples) < count:
        async with http.get(f"{prefix}.{n}", headers={"Accept": JSON}) as reply:
            document = (await reply.json(content_type=None))["restms"]["message"][0]
        clock.received(document["content"][0]["value"])
        async with http.delete(f"{prefix}.{n}") as reply:
            await reply.read()
        n += 1


async def latency(
    kind: str, sessions: dict[str, Any], publisher: httpx2.AsyncClient, default: str, count: int
) -> Clock:
    async with AsyncClient(sessions["base"]) as setup:
        pipe = await setup.create_pipe(title=f"latency {kind}")
    reader = {"library": _read_library, "httpx2": _read_httpx, "aiohttp": _read_aiohttp}[kind]
    clock = Clock()
    cpu = time.process_time()
    reading = asyncio.create_task(reader(sessions[kind], pipe.href, count, clock))
    headers = {"Content-Type": JSON}
    for i in range(count):
        text = f"{kind}-{i}-{payload(64)}"
        body = {"restms": {"message": [{"address": pipe.name, "content": [{"value": text}]}]}}
        await asyncio.sleep(0.002)  # the reader's GET is waiting on the asynclet by now
        clock.got.clear()
        clock.sent[text] = time.perf_counter()
        await publisher.post(default, content=json.dumps(body).encode(), headers=headers)
        await asyncio.wait_for(clock.got.wait(), 30)
    await asyncio.wait_for(reading, 30)
    clock.cpu_us = (time.process_time() - cpu) / count * 1e6
    async with AsyncClient(sessions["base"]) as setup:
        await setup.delete(pipe)
    return clock


# ---------------------------------------------------------------- the client alone
async def client_only(requests: int) -> dict[str, list[float]]:
    """CPU-µs of one publish of a batch, library and raw httpx2, against httpx2's
    MockTransport answering the gateway's reply: the client's cost alone."""
    reply = json.dumps({"restms": {"message": [{"count": "1"}] * BATCH}}).encode()

    def answer(request: httpx2.Request) -> httpx2.Response:
        return httpx2.Response(200, content=reply, headers={"Content-Type": JSON})

    feed = "http://127.0.0.1:9/restms/feed/mock"
    library = AsyncClient("http://127.0.0.1:9")
    library._http = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    raw = httpx2.AsyncClient(transport=httpx2.MockTransport(answer))
    batch = [Message.of(payload()) for _ in range(BATCH)]
    costs: dict[str, list[float]] = {"library": [], "httpx2": []}
    async with library, raw:
        for kind in ("library", "httpx2") * 3:
            cpu = time.process_time()
            for _ in range(requests):
                if kind == "library":
                    await library.publish(feed, batch)
                else:
                    body, headers = _raw_batch()
                    (await raw.post(feed, content=body, headers=headers)).raise_for_status()
            costs[kind].append((time.process_time() - cpu) / requests * 1e6)
    return costs


# ---------------------------------------------------------------- run
async def run(args: argparse.Namespace) -> dict[str, Any]:
    server = Server("gateway", name="client").wait_ready()
    kinds = ("library", "httpx2", "aiohttp")
    figures: dict[str, dict[str, list[float]]] = {
        k: {"msgs_per_s": [], "publish_cpu_us": [], "p50_ms": [], "p90_ms": [], "read_cpu_us": []}
        for k in kinds
    }
    try:
        async with (
            AsyncClient(server.base) as library,
            httpx2.AsyncClient() as raw_httpx,
            aiohttp.ClientSession() as raw_aiohttp,
            httpx2.AsyncClient() as publisher,
        ):
            sessions = {"library": library, "httpx2": raw_httpx, "aiohttp": raw_aiohttp}
            sessions["base"] = server.base
            feed = await library.create_feed("bench-client", "fanout")
            sink = await library.create_pipe(
                title="sink", max_messages=10_000, overflow="drop-oldest"
            )
            await library.join(sink, feed)
            default = (await library.domain()).feed("default").href
            for kind in kinds:  # warm-up: connections, first imports
                await throughput(kind, sessions, feed.href, 2)
                await latency(kind, sessions, publisher, default, 20)
            for number in range(args.rounds):
                order = kinds if number % 2 == 0 else tuple(reversed(kinds))
                for kind in order:
                    rate, cpu = await throughput(kind, sessions, feed.href, args.requests)
                    clock = await latency(kind, sessions, publisher, default, args.messages)
                    figures[kind]["msgs_per_s"].append(rate)
                    figures[kind]["publish_cpu_us"].append(cpu)
                    figures[kind]["p50_ms"].append(statistics.median(clock.samples))
                    figures[kind]["p90_ms"].append(percentile(clock.samples, 90) or 0.0)
                    figures[kind]["read_cpu_us"].append(clock.cpu_us)
                    log(
                        f"round {number + 1} {kind}: {rate:,.0f} msg/s, "
                        f"p50 {figures[kind]['p50_ms'][-1]:.3f} ms"
                    )
    finally:
        server.stop()
    medians = {k: {m: statistics.median(v) for m, v in f.items()} for k, f in figures.items()}
    ratios = {
        raw: {m: medians["library"][m] / medians[raw][m] for m in medians[raw]}
        for raw in ("httpx2", "aiohttp")
    }
    alone = await client_only(200)
    return {
        "machine": machine(),
        "args": vars(args),
        "rounds": figures,
        "medians": medians,
        "ratios": ratios,
        "client_only_us_per_request": alone,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=6)
    parser.add_argument("--requests", type=int, default=25, help="batches per publisher a round")
    parser.add_argument("--messages", type=int, default=200, help="latency samples a round")
    args = parser.parse_args()
    result = asyncio.run(run(args))
    RESULTS.mkdir(parents=True, exist_ok=True)
    (RESULTS / "client.json").write_text(json.dumps(result, indent=2))
    for kind, values in result["medians"].items():
        log(f"{kind:8} " + "  ".join(f"{m} {v:,.3f}" for m, v in values.items()))
    for raw, values in result["ratios"].items():
        log(f"library / {raw}: " + "  ".join(f"{m} {v:.3f}" for m, v in values.items()))
    for kind, costs in result["client_only_us_per_request"].items():
        log(f"client alone, {kind}: " + ", ".join(f"{c:.0f}" for c in costs) + " us a request")


if __name__ == "__main__":
    main()
