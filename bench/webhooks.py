"""Benchmark 11: webhook pipe delivery to a local receiver, against a plain HTTP client.

The gateway runs in its own process (:func:`bench.common.start`, default SQLite store,
``webhook_allow = 127.0.0.1``, no memory budget). The receiver is an aiohttp server
(uvloop) in a spawned process of its own on 127.0.0.1: it answers the verification
GET with its challenge and every POST with 204, and records the arrival time
(``time.monotonic``, one clock for every process on Linux) and ``message_id`` of each
message (it parses the JSON body, as a real receiver would).

Each message is 1 KiB of text. Runs, each of ``count`` messages (``samples`` for the
latency runs):

* **gateway, concurrency c** (c = 1 and 8): a fresh webhook pipe with
  ``concurrency=c`` (verified before the run), then the benchmark publishes the
  messages to it through the default feed in batches of 100, as fast as the gateway
  takes them. Throughput: messages received over the time from the first publish to
  the last arrival. The receiver checks that every message arrived, none twice, and
  with c = 1 in the order published. The gateway's CPU time per message is read from
  /proc.
* **baseline, concurrency c** (the same-run baseline): the benchmark POSTs the same
  documents (the message document the gateway would send) to the same receiver with
  a plain aiohttp client, c requests at a time over keep-alive connections: what HTTP
  delivery costs without the gateway.
* **latency, gateway**: ``samples`` messages published one at a time, 5 ms apart
  (far below capacity: no queueing), to a concurrency-1 pipe; publish -> receiver
  latency is the arrival time minus the time the publish request started (p50, p99).
* **latency, baseline**: the same pacing with plain POSTs; send -> arrival.

Every round runs all six, taking turns (the order flips every round); figures are
medians over rounds, and each ratio is the median of the per-round ratios. Every wait
is bounded (:data:`STALL`, :data:`TIMEOUT`).
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import time
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import orjson
import uvloop
from aiohttp import web

from bench.common import (
    JSON,
    PAYLOAD_SIZE,
    BenchError,
    Child,
    Runs,
    cpu_seconds,
    json_reply,
    log,
    machine_busy,
    median,
    payload,
    percentile,
    play_rounds,
    start,
    system_ticks,
)

STALL = 10.0  # seconds without a new arrival before a run gives up
TIMEOUT = 300.0  # seconds any one run may take
READY = 20.0  # seconds for the receiver to start, or a pipe to be verified
BATCH = 100  # messages per publish request
PACE = 0.005  # seconds between messages in the latency runs
CONCURRENCY = (1, 8)
HEADERS = {"Content-Type": JSON, "Accept": JSON}
BODY = payload(PAYLOAD_SIZE)


# ---------------------------------------------------------------- the receiver process
class _Records:
    """What the receiver got since the last reset."""

    def __init__(self) -> None:
        self.arrivals: dict[str, float] = {}
        self.order: list[str] = []
        self.repeats = 0
        self.first = self.last = 0.0
        self.target = 0
        self.done = asyncio.Event()

    def add(self, message_id: str, now: float) -> None:
        if message_id in self.arrivals:
            self.repeats += 1
            return
        if not self.arrivals:
            self.first = now
        self.last = now
        self.arrivals[message_id] = now
        self.order.append(message_id)
        if self.target and len(self.arrivals) >= self.target:
            self.done.set()


async def _receive(conn: Connection) -> None:
    records = _Records()

    async def hook(request: web.Request) -> web.Response:
        if request.method == "GET":
            return web.Response(text=request.query.get("restms.challenge", ""))
        data = await request.read()
        now = time.monotonic()
        message = orjson.loads(data)["restms"]["message"][0]
        records.add(message["message_id"], now)
        return web.Response(status=204)

    app = web.Application()
    app.router.add_route("*", "/hook", hook)
    runner = web.AppRunner(app, access_log=None)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    conn.send(("ready", runner.addresses[0][1]))
    try:
        while True:
            if not await asyncio.to_thread(conn.poll, TIMEOUT):
                return  # the benchmark has said nothing for too long
            command = conn.recv()  # a reader thread: the loop keeps serving meanwhile
            if command is None:
                return
            op, target = command
            if op == "reset":
                records = _Records()
                records.target = target
                conn.send(("reset", None))
            elif op == "wait":  # until the target is reached, or STALL seconds of silence
                while not records.done.is_set():
                    seen = len(records.arrivals)
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(records.done.wait(), STALL)
                    if len(records.arrivals) == seen:
                        break
                result = {
                    "received": len(records.arrivals),
                    "repeats": records.repeats,
                    "first": records.first,
                    "last": records.last,
                    "order": records.order,
                    "arrivals": records.arrivals,
                }
                conn.send(("result", result))
    finally:
        await runner.cleanup()


def _receiver(conn: Connection) -> None:
    with contextlib.suppress(TimeoutError, EOFError):  # the benchmark is gone
        uvloop.run(_receive(conn))


class Receiver(Child):
    """The benchmark's end of the receiver process."""

    def __init__(self) -> None:
        super().__init__("receiver", _receiver)
        self.url = f"http://127.0.0.1:{self.expect('ready', READY)}/hook"

    def reset(self, target: int) -> None:
        self.conn.send(("reset", target))
        self.expect("reset", READY)

    def wait(self) -> dict[str, Any]:
        self.conn.send(("wait", 0))
        result: dict[str, Any] = self.expect("result", TIMEOUT)
        return result


# ---------------------------------------------------------------- documents
def message(address: str, message_id: str) -> dict[str, Any]:
    return {
        "address": address,
        "message_id": message_id,
        "content": [{"type": "text/plain", "encoding": "plain", "value": BODY}],
    }


def ids(tag: str, count: int) -> list[str]:
    return [f"{tag}-{i}" for i in range(count)]


# ---------------------------------------------------------------- the gateway side
async def new_pipe(http: aiohttp.ClientSession, base: str, callback: str, lanes: int) -> str:
    """A verified webhook pipe; its URI."""
    spec = {"type": "webhook", "callback": callback, "concurrency": lanes}
    async with http.post(
        f"{base}/restms/domain/default",
        data=orjson.dumps({"restms": {"pipe": [spec]}}),
        headers=HEADERS,
    ) as reply:
        await json_reply(reply, (201,))
        uri = reply.headers["Location"]
    deadline = time.monotonic() + READY
    while True:
        async with http.get(uri, headers=HEADERS) as reply:
            shown = (await json_reply(reply, (200,)))["restms"]["pipe"][0]
        if shown["state"] == "active":
            return uri
        if shown["state"] != "verifying" or time.monotonic() > deadline:
            raise BenchError(f"webhook pipe not verified: {shown['state']} {shown['last_error']}")
        await asyncio.sleep(0.02)


async def publish(http: aiohttp.ClientSession, base: str, messages: list[Any]) -> None:
    async with http.post(
        f"{base}/restms/feed/default",
        data=orjson.dumps({"restms": {"message": messages}}),
        headers=HEADERS,
    ) as reply:
        counts = (await json_reply(reply, (200,)))["restms"]["message"]
        if any(c["count"] != "1" for c in counts):
            raise BenchError(f"a publish reached no pipe: {counts[:3]}")


async def gateway_run(
    base: str, callback: str, lanes: int, tag: str, count: int, paced: bool
) -> dict[str, Any]:
    """Publish ``count`` messages to a fresh pipe; the send times (first, or each)."""
    async with aiohttp.ClientSession() as http:
        uri = await new_pipe(http, base, callback, lanes)
        address = uri.rsplit("/", 1)[1]
        names = ids(tag, count)
        sent: dict[str, float] = {}
        first = time.monotonic()
        if paced:
            for name in names:
                sent[name] = time.monotonic()
                await publish(http, base, [message(address, name)])
                await asyncio.sleep(max(0.0, sent[name] + PACE - time.monotonic()))
        else:
            for at in range(0, count, BATCH):
                await publish(http, base, [message(address, n) for n in names[at : at + BATCH]])
        return {"first": first, "sent": sent, "uri": uri}


async def drop_pipe(uri: str) -> None:
    async with aiohttp.ClientSession() as http, http.delete(uri) as reply:
        await reply.read()


async def baseline_run(callback: str, lanes: int, tag: str, count: int, paced: bool) -> Any:
    """POST the same documents straight to the receiver, ``lanes`` at a time."""
    names = ids(tag, count)
    bodies = [orjson.dumps({"restms": {"message": [message("bench", name)]}}) for name in names]
    connector = aiohttp.TCPConnector(limit=lanes, family=socket.AF_INET)
    sent: dict[str, float] = {}
    async with aiohttp.ClientSession(connector=connector) as http:

        async def post(index: int) -> None:
            async with http.post(callback, data=bodies[index], headers=HEADERS) as reply:
                await reply.read()
                if reply.status != 204:
                    raise BenchError(f"the receiver answered {reply.status}")

        first = time.monotonic()
        if paced:
            for index, name in enumerate(names):
                sent[name] = time.monotonic()
                await post(index)
                await asyncio.sleep(max(0.0, sent[name] + PACE - time.monotonic()))
        else:
            next_index = iter(range(count))

            async def lane() -> None:
                for index in next_index:
                    await post(index)

            await asyncio.gather(*(lane() for _ in range(lanes)))
    return {"first": first, "sent": sent}


# ---------------------------------------------------------------- one run
def run_once(receiver: Receiver, gateway: Any, run: str, count: int, tag: str) -> dict[str, Any]:
    """One run: ``gw1``, ``gw8``, ``base1``, ``base8``, ``gwlat`` or ``baselat``."""
    paced = run.endswith("lat")
    lanes = 1 if paced else int(run[-1])
    receiver.reset(count)
    ticks0, cpu0, own0 = system_ticks(), cpu_seconds(gateway.pid), time.process_time()
    if run.startswith("gw"):
        sent = uvloop.run(gateway_run(gateway.base, receiver.url, lanes, tag, count, paced))
    else:
        sent = uvloop.run(baseline_run(receiver.url, lanes, tag, count, paced))
    own = time.process_time() - own0  # the benchmark's own CPU: the plain client's cost
    got = receiver.wait()
    busy = machine_busy(ticks0, system_ticks())
    cpu = cpu_seconds(gateway.pid) - cpu0
    if "uri" in sent:
        uvloop.run(drop_pipe(sent["uri"]))
    names = ids(tag, count)
    out: dict[str, Any] = {
        "run": run,
        "count": count,
        "received": got["received"],
        "lost": count - got["received"],
        "repeats": got["repeats"],
        "unordered": sum(a != b for a, b in zip(got["order"], names, strict=False)),
        "machine_busy": busy,
    }
    if got["received"] < 2:
        raise BenchError(f"{run}: {got['received']} of {count} messages arrived")
    seconds = got["last"] - sent["first"]
    out["seconds"] = seconds
    out["msg_per_s"] = got["received"] / seconds if seconds > 0 else 0.0
    if run.startswith("gw"):
        out["gateway_cpu_us_per_msg"] = cpu / count * 1e6
    else:
        out["client_cpu_us_per_msg"] = own / count * 1e6
    if paced:
        arrivals = got["arrivals"]
        latencies = [
            (arrivals[name] - at) * 1000 for name, at in sent["sent"].items() if name in arrivals
        ]
        out["p50_ms"] = percentile(latencies, 50)
        out["p99_ms"] = percentile(latencies, 99)
    return out


def _problems(result: dict[str, Any]) -> list[str]:
    found = [f"{result[key]} {key}" for key in ("lost", "repeats") if result[key]]
    if result["run"] in ("gw1", "gwlat") and result["unordered"]:
        found.append(f"{result['unordered']} out of order")
    return found


# ---------------------------------------------------------------- rounds
RUNS = ("gw1", "base1", "gw8", "base8", "gwlat", "baselat")
LABELS = {
    "gw1": "gateway, concurrency 1",
    "base1": "plain client, 1 at a time",
    "gw8": "gateway, concurrency 8",
    "base8": "plain client, 8 at a time",
    "gwlat": "gateway latency",
    "baselat": "plain client latency",
}


def run(rounds: int, count: int, samples: int) -> dict[str, Any]:
    """A warm-up of every run, then ``rounds`` rounds of the six."""
    env = {
        "RESTMS_WEBHOOK_ALLOW": "127.0.0.1",
        "RESTMS_RATE_LIMIT": "0",
        "RESTMS_MEMORY_BUDGET": "0",
        "RESTMS_MAX_PIPE_MESSAGES": str(max(100_000, 2 * count)),
    }
    out: dict[str, Any] = {
        "count": count,
        "samples": samples,
        "payload_bytes": PAYLOAD_SIZE,
        "settings": {
            "gateway": "own process (main.py serve), sqlite store, non-persistent messages",
            "receiver": "aiohttp + uvloop in its own process, 204 to every POST",
            "publish": f"batches of {BATCH} to the default feed",
            "latency pacing": f"one message every {PACE * 1000:g} ms",
        },
    }
    log("  " + ", ".join(f"{k}={v}" for k, v in out["settings"].items()))
    t0 = time.monotonic()
    receiver = Receiver()
    gateway = start("gateway", env)
    try:
        for name in RUNS:  # warm-up: not recorded, but checked
            size = max(200, count // 10) if not name.endswith("lat") else 50
            wrong = _problems(run_once(receiver, gateway, name, size, f"warm-{name}"))
            if wrong:
                raise BenchError(f"warm-up of {name}: {', '.join(wrong)}")

        def one(n: int, name: str) -> dict[str, Any]:
            size = samples if name.endswith("lat") else count
            return run_once(receiver, gateway, name, size, f"r{n}-{name}")

        play_rounds(out, rounds, RUNS, one, _ratios, _problems, _log_round)
        if not gateway.alive():
            raise BenchError("the gateway died")
    finally:
        gateway.stop()
        receiver.close()
    summarize(out)
    out["seconds"] = time.monotonic() - t0
    log(f"  {out['seconds']:.0f} s in all")
    return out


def _ratios(runs: Runs) -> dict[str, float]:
    """Gateway / baseline: throughput at each concurrency, latency percentiles."""
    return {
        "c1": runs["gw1"]["msg_per_s"] / runs["base1"]["msg_per_s"],
        "c8": runs["gw8"]["msg_per_s"] / runs["base8"]["msg_per_s"],
        "p50": runs["gwlat"]["p50_ms"] / runs["baselat"]["p50_ms"],
        "p99": runs["gwlat"]["p99_ms"] / runs["baselat"]["p99_ms"],
    }


def _log_round(label: str, runs: Runs, ratios: dict[str, float]) -> None:
    r = runs
    log(
        f"  {label}: c1 {r['gw1']['msg_per_s']:,.0f} / {r['base1']['msg_per_s']:,.0f} msg/s "
        f"= {ratios['c1']:.3f} (CPU-us/msg gateway {r['gw1']['gateway_cpu_us_per_msg']:.0f}, "
        f"client {r['base1']['client_cpu_us_per_msg']:.0f}); c8 "
        f"{r['gw8']['msg_per_s']:,.0f} / {r['base8']['msg_per_s']:,.0f} = {ratios['c8']:.3f} "
        f"({r['gw8']['gateway_cpu_us_per_msg']:.0f}, "
        f"{r['base8']['client_cpu_us_per_msg']:.0f}); latency p50 "
        f"{r['gwlat']['p50_ms']:.2f} / {r['baselat']['p50_ms']:.2f} ms, p99 "
        f"{r['gwlat']['p99_ms']:.2f} / {r['baselat']['p99_ms']:.2f} ms; busy "
        + "/".join(f"{r[name]['machine_busy']:.0%}" for name in RUNS)
    )


def summarize(out: dict[str, Any]) -> None:
    """Medians and per-round ratios into ``out``; one log line."""
    rounds = out["rounds"]
    for name in RUNS:
        runs = [r["runs"][name] for r in rounds]
        out[f"{name}_median"] = median([x["msg_per_s"] for x in runs])
        if name.endswith("lat"):
            out[f"{name}_p50_ms"] = median([x["p50_ms"] for x in runs])
            out[f"{name}_p99_ms"] = median([x["p99_ms"] for x in runs])
        key = "gateway_cpu_us_per_msg" if name.startswith("gw") else "client_cpu_us_per_msg"
        out[f"{name}_cpu_us_per_msg"] = median([x[key] for x in runs])
    for key in ("c1", "c8", "p50", "p99"):
        out[f"{key}_ratios"] = [r["ratios"][key] for r in rounds]
        out[f"{key}_ratio"] = median(out[f"{key}_ratios"])
    out["problems"] = [r["problems"] for r in rounds if r["problems"]]
    log(
        f"  CPU-us per message: gateway c1 {out['gw1_cpu_us_per_msg']:.0f}, c8 "
        f"{out['gw8_cpu_us_per_msg']:.0f}; plain client c1 {out['base1_cpu_us_per_msg']:.0f}, "
        f"c8 {out['base8_cpu_us_per_msg']:.0f}"
    )
    log(
        f"  medians: c1 {out['gw1_median']:,.0f} / {out['base1_median']:,.0f} msg/s "
        f"(ratio {out['c1_ratio']:.3f}); c8 {out['gw8_median']:,.0f} / "
        f"{out['base8_median']:,.0f} (ratio {out['c8_ratio']:.3f}); p50 "
        f"{out['gwlat_p50_ms']:.2f} / {out['baselat_p50_ms']:.2f} ms, p99 "
        f"{out['gwlat_p99_ms']:.2f} / {out['baselat_p99_ms']:.2f} ms; lost, repeated or "
        f"out of order: {out['problems'] or 'none'}"
    )
