"""Benchmark 9: the AMQP 1.0 bridge's throughput in both directions, msg/s of 1 KiB messages.

The gateway runs in its own process (:func:`bench.common.start`, as in benchmarks
1-8), with the broker on 127.0.0.1:5672 (RabbitMQ with its AMQP 1.0 plugin, guest).
The loopback guest is given ``restms:admin`` (``RESTMS_GUEST_SCOPES``) so the
benchmark can create bridges and read their counters on ``/admin/bridges``.

* **gateway -> broker** (``out``): one outbound bridge from a fanout feed to a queue,
  made once per gateway and warmed up. A run publishes ``count`` messages over HTTP, in
  XML batches of :data:`BATCH` with :data:`POSTS_IN_FLIGHT` POSTs in flight (so HTTP is
  not the bottleneck), and is timed from the first POST until the bridge's
  ``counters.accepted`` has grown by ``count`` (every message settled ``accepted`` by
  the broker). Baseline: :class:`RawSender`, an event-driven proton Container sending
  ``count`` messages to another queue as fast as the broker's credit allows, timed
  from its first send to its last ``accepted``.
* **broker -> gateway** (``in``): a fresh queue preloaded with ``count`` messages (by a
  raw sender, untimed), a fresh pipe (limit above ``count``) joined to a fanout feed,
  then an inbound bridge created with ``POST /admin/bridges``; timed from that POST (so
  it includes connecting) until ``counters.published`` reaches ``count``. The bridge is
  deleted afterwards (its queue too: see :func:`_one_round`). Baseline:
  :class:`RawReceiver` with the bridge's credit window (:data:`WINDOW`), accepting each
  message, draining an equally preloaded queue; timed from its start (connecting
  included) to the last message.

Counters are polled every :data:`POLL` seconds. Each round runs both directions,
baseline and bridge taking turns (the order flips every round); the figure that counts
is the median over rounds of each round's bridge / raw ratio. Every message is the same
1 KiB of text (non-persistent); queues are durable, as the bridge's durable termini make
RabbitMQ declare them. All queues are named ``restms-bench-...`` and deleted at the end.
The broker is shared with other test suites, some of which restart its app: a round
that meets a restart (a lost connection, a stalled counter) is thrown away and run
again, at most :data:`ATTEMPTS` times.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import uuid
from typing import Any

import aiohttp
import pika
import uvloop
from proton import Message, Terminus
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption

from bench import rest
from bench.common import (
    JSON,
    XML,
    BenchError,
    Server,
    cpu_seconds,
    json_reply,
    log,
    machine_busy,
    median,
    payload,
    start,
    system_ticks,
    xml_messages,
)

BROKER = "127.0.0.1"
BROKER_PORT = 5672
AMQP_URL = f"amqp://guest:guest@{BROKER}:{BROKER_PORT}"
QUEUE_PREFIX = "restms-bench-"
WINDOW = 256  # the bridge's default window: outbound unsettled at most, inbound credit
BATCH = 500  # messages per HTTP POST (outbound)
POSTS_IN_FLIGHT = 4
POLL = 0.025  # seconds between reads of a bridge's counters
TARGET = 0.50  # bridge msg/s at least this share of raw proton msg/s, each direction
TIMEOUT = 60.0  # seconds any one raw run may take
STALL = 15.0  # seconds a bridge's counter may stand still before the run is given up
ATTEMPTS = 3  # a round broken by a broker restart (other suites' tests) is run again
OUT_FEED = "bench-amqp-out"
IN_FEED = "bench-amqp-in"
ADDRESS = "bench.amqp"
GUEST_SCOPES = "restms:read restms:publish restms:subscribe restms:admin"


# ---------------------------------------------------------------- raw proton clients
class _DurableTerminus(LinkOption):
    """The queues are durable: RabbitMQ 3.10 wants the link's terminus to say so."""

    def apply(self, link: Any) -> None:
        terminus = link.target if link.is_sender else link.source
        terminus.durability = Terminus.DELIVERIES


def _message(body: bytes) -> Message:
    """What the outbound bridge makes of a benchmark message: subject, type, one data
    section."""
    message = Message(subject=ADDRESS, content_type="text/plain", body=body)
    message.inferred = True
    return message


class _Client(MessagingHandler):
    """Common part of the raw clients: connect, give up after :data:`TIMEOUT`.

    A client ends by closing its connection and stopping its Container only once the
    broker has answered the close: ``Container.stop()`` right after ``close()`` would
    return before the close is sent and leave the socket open, and RabbitMQ would keep
    the receiver's link and its credit (holding back up to a window of later messages)
    for as long as this process lives.
    """

    def __init__(self, queue: str, count: int, **options: Any) -> None:
        super().__init__(**options)
        self.address = f"/queue/{queue}"
        self.count = count
        self.error = ""
        self.started = self.first = self.done = 0.0
        self._conn: Any = None
        self._timer: Any = None

    def on_start(self, event: Any) -> None:
        self.started = time.perf_counter()
        self._conn = event.container.connect(
            AMQP_URL, allowed_mechs="PLAIN", allow_insecure_mechs=True, reconnect=False
        )
        self.link(event.container, self._conn)
        self._timer = event.container.schedule(TIMEOUT, self)

    def link(self, container: Container, conn: Any) -> None:
        raise NotImplementedError

    def on_timer_task(self, event: Any) -> None:
        if self._conn is None:  # the broker did not answer the close in time
            event.container.stop()
            return
        self.error = self.error or f"timed out after {TIMEOUT:g} s"
        self.finish(event)

    def finish(self, event: Any) -> None:
        """Close the connection; ``run()`` returns when the broker has closed it too."""
        if self._conn is None:
            return
        self._conn.close()
        self._conn = None
        self._timer.cancel()
        self._timer = event.container.schedule(10.0, self)

    def on_connection_closed(self, event: Any) -> None:
        self._timer.cancel()  # the broker has closed it too: the link is gone there
        event.container.stop()  # (else run() returns only after its 3.14 s idle timeout)

    def on_disconnected(self, event: Any) -> None:
        if self._conn is None:
            self._timer.cancel()
            event.container.stop()

    def on_transport_error(self, event: Any) -> None:
        self.error = self.error or f"transport error: {event.transport.condition}"
        self.finish(event)

    def on_connection_error(self, event: Any) -> None:
        self.error = self.error or f"connection error: {event.connection.remote_condition}"
        self.finish(event)

    def on_link_error(self, event: Any) -> None:
        self.error = self.error or f"link error: {event.link.remote_condition}"
        self.finish(event)

    def run(self) -> dict[str, Any]:
        """Run to the end (blocking); the figures, or BenchError."""
        Container(self).run()
        if self.error or not self.done:
            raise BenchError(f"raw client on {self.address}: {self.error or 'did not finish'}")
        seconds = self.done - self.first
        return {"seconds": seconds, "msg_per_s": self.count / seconds, "count": self.count}


class RawSender(_Client):
    """Sends ``count`` messages as fast as credit allows; done when all are accepted."""

    def __init__(self, queue: str, count: int) -> None:
        super().__init__(queue, count)  # auto_settle: settled once the broker settles
        self.body = payload().encode()
        self.sent = self.accepted = 0

    def link(self, container: Container, conn: Any) -> None:
        container.create_sender(conn, self.address, options=_DurableTerminus())

    def on_sendable(self, event: Any) -> None:
        if not self.first:
            self.first = time.perf_counter()
        sender = event.sender
        while sender.credit > 0 and self.sent < self.count:
            sender.send(_message(self.body))
            self.sent += 1

    def on_accepted(self, event: Any) -> None:
        self.accepted += 1
        if self.accepted == self.count:
            self.done = time.perf_counter()
            self.finish(event)

    def on_rejected(self, event: Any) -> None:
        self.error = f"the broker rejected a message: {event.delivery.remote.condition}"
        self.finish(event)

    def on_released(self, event: Any) -> None:
        self.error = "the broker released a message"
        self.finish(event)


class RawReceiver(_Client):
    """Receives ``count`` messages with a credit window of :data:`WINDOW`, accepting each;
    timed from its start (connecting included), like the bridge from its creation."""

    def __init__(self, queue: str, count: int) -> None:
        super().__init__(queue, count, prefetch=WINDOW, auto_accept=True)
        self.received = 0
        self.size_ok = True

    def link(self, container: Container, conn: Any) -> None:
        self.first = self.started
        container.create_receiver(conn, self.address, options=_DurableTerminus())

    def on_message(self, event: Any) -> None:
        self.received += 1
        if len(event.message.body) != 1024:
            self.size_ok = False
        if self.received == self.count:
            self.done = time.perf_counter()
            # the accept of this last one is made after this returns: close after it
            event.container.schedule(0, _Closer(self))


class _Closer:
    def __init__(self, client: _Client) -> None:
        self.client = client

    def on_timer_task(self, event: Any) -> None:
        self.client.finish(event)


# ---------------------------------------------------------------- the broker, over 0-9-1
class Queues:
    """Declares, fills (over AMQP 1.0), empties and deletes the benchmark's queues.

    The broker is shared: other suites' tests stop and start its app, which drops
    this 0-9-1 connection. Every call reopens it (waiting for the broker) when it died.
    """

    def __init__(self) -> None:
        self._params = pika.ConnectionParameters(
            BROKER, BROKER_PORT, credentials=pika.PlainCredentials("guest", "guest")
        )
        self._conn: Any = None
        self._channel: Any = None
        self.names: list[str] = []

    def _call(self, method: str, *args: Any, patience: float = 60.0, **kwargs: Any) -> Any:
        deadline = time.monotonic() + patience
        while True:
            try:
                if self._conn is None or not self._conn.is_open:
                    self._conn = pika.BlockingConnection(self._params)
                    self._channel = self._conn.channel()
                return getattr(self._channel, method)(*args, **kwargs)
            except pika.exceptions.AMQPConnectionError as exc:
                self._conn = None
                if time.monotonic() > deadline:
                    raise BenchError(f"the broker is away: {exc!r}") from exc
                log(f"  broker connection lost ({exc!r}); reconnecting")
                time.sleep(1.0)

    def new(self, role: str) -> str:
        name = f"{QUEUE_PREFIX}{role}-{uuid.uuid4().hex[:8]}"
        if not name.startswith(QUEUE_PREFIX):
            raise BenchError(name)
        self.names.append(name)
        self._call("queue_declare", name, durable=True)
        return name

    def drop(self, name: str) -> None:
        self._call("queue_delete", name)
        self.names.remove(name)

    def depth(self, name: str) -> int:
        return int(self._call("queue_declare", name, passive=True).method.message_count)

    def purge(self, name: str) -> None:
        self._call("queue_purge", name)

    def preload(self, name: str, count: int) -> dict[str, Any]:
        """Empty the queue, then ``count`` messages into it with a raw sender."""
        self.purge(name)
        result = RawSender(name, count).run()
        deadline = time.monotonic() + 10  # the queue's count may trail the accepts a little
        while (depth := self.depth(name)) != count:
            if depth > count or time.monotonic() > deadline:
                raise BenchError(f"queue {name} holds {depth} messages, not {count}")
            time.sleep(0.05)
        return result

    def close(self) -> None:
        for name in self.names:
            try:
                self._call("queue_delete", name, patience=5.0)
            except (BenchError, pika.exceptions.AMQPError) as exc:
                log(f"  could not delete queue {name}: {exc!r}")
        if self._conn is not None:
            with contextlib.suppress(pika.exceptions.AMQPError):
                self._conn.close()


# ---------------------------------------------------------------- the gateway side
async def bridge_status(http: aiohttp.ClientSession, base: str, name: str) -> dict[str, Any]:
    async with http.get(f"{base}/admin/bridges/{name}") as reply:
        status: dict[str, Any] = await json_reply(reply, (200,))
        return status


async def create_bridge(http: aiohttp.ClientSession, base: str, **definition: Any) -> None:
    definition = {"urls": [AMQP_URL], **definition}
    async with http.post(f"{base}/admin/bridges", json=definition) as reply:
        await json_reply(reply, (201,))


async def delete_bridge(http: aiohttp.ClientSession, base: str, name: str) -> None:
    async with http.delete(f"{base}/admin/bridges/{name}?discard=true") as reply:
        await json_reply(reply, (200, 404))


async def wait_counter(
    http: aiohttp.ClientSession,
    base: str,
    name: str,
    counter: str,
    goal: int,
    disconnects: int = 0,
) -> dict[str, Any]:
    """Poll the bridge until ``counters[counter] >= goal``; its last status. A lost
    connection (the shared broker restarted: non-persistent messages are gone) or
    :data:`STALL` seconds without progress end the run with BenchError."""
    last, moved = -1, time.monotonic()
    while True:
        status = await bridge_status(http, base, name)
        counters = status["counters"]
        if counters[counter] >= goal:
            return status
        if counters["disconnects"] > disconnects:
            raise BenchError(f"bridge {name} lost its connection: {status['last_error']}")
        if counters[counter] != last:
            last, moved = counters[counter], time.monotonic()
        elif time.monotonic() - moved > STALL:
            raise BenchError(f"bridge {name}: {counter} stuck at {counters}")
        await asyncio.sleep(POLL)


async def wait_up(http: aiohttp.ClientSession, base: str, name: str) -> None:
    deadline = time.monotonic() + 20
    while (status := await bridge_status(http, base, name))["state"] != "up":
        if time.monotonic() > deadline:
            raise BenchError(f"bridge {name} not up: {status}")
        await asyncio.sleep(POLL)


async def setup_outbound(base: str, queue: str, count: int) -> str:
    """The outbound feed and bridge (up), then a warm-up of ``count // 10`` messages."""
    name = "bench-out"
    async with aiohttp.ClientSession() as http:
        await rest.create_feed(http, base, OUT_FEED)
        await create_bridge(
            http,
            base,
            name=name,
            direction="out",
            feed=OUT_FEED,
            target=f"/queue/{queue}",
            max_messages=4 * count,
            window=WINDOW,
        )
        await wait_up(http, base, name)
    await publish_outbound(base, name, max(BATCH, count // 10))
    return name


async def publish_outbound(base: str, name: str, count: int) -> dict[str, Any]:
    """``count`` messages over HTTP in batches; timed until the broker accepted them all."""
    feed = f"{base}/restms/feed/{OUT_FEED}"
    batches = [min(BATCH, count - n) for n in range(0, count, BATCH)]
    bodies = {size: xml_messages(size, address=ADDRESS) for size in set(batches)}
    async with aiohttp.ClientSession() as http:
        counters = (await bridge_status(http, base, name))["counters"]
        before, disconnects = counters["accepted"], counters["disconnects"]
        queue: asyncio.Queue[int] = asyncio.Queue()
        for size in batches:
            queue.put_nowait(size)

        async def poster() -> None:
            while not queue.empty():
                size = queue.get_nowait()
                reply = await rest.publish(http, feed, bodies[size], XML)
                if reply.count('count="1"') != size:  # each reached the bridge's pipe
                    raise BenchError(f"publish not routed to the bridge: {reply[:200]}")

        t0 = time.perf_counter()
        await asyncio.gather(*(poster() for _ in range(POSTS_IN_FLIGHT)))
        posted = time.perf_counter() - t0
        status = await wait_counter(http, base, name, "accepted", before + count, disconnects)
        seconds = time.perf_counter() - t0
        counters = status["counters"]
    if counters["rejected"] or counters["unmappable"]:
        raise BenchError(f"bridge {name} refused messages: {counters}")
    return {
        "count": count,
        "seconds": seconds,
        "msg_per_s": count / seconds,
        "http_seconds": posted,
        "http_msg_per_s": count / posted,
        "released": counters["released"],
    }


async def run_inbound(base: str, queue: str, count: int, serial: int) -> dict[str, Any]:
    """A fresh pipe on the inbound feed, then a fresh inbound bridge from ``queue``;
    timed from its creation until it has published ``count`` messages."""
    name = f"bench-in-{serial}"
    async with aiohttp.ClientSession() as http:
        pipe, _ = await rest.create_pipe(http, base)
        try:
            await rest.join(http, pipe, f"{base}/restms/feed/{IN_FEED}")
            t0 = time.perf_counter()
            await create_bridge(
                http,
                base,
                name=name,
                direction="in",
                feed=IN_FEED,
                source=f"/queue/{queue}",
                window=WINDOW,
            )
            status = await wait_counter(http, base, name, "published", count)
            seconds = time.perf_counter() - t0
            counters = status["counters"]
            await asyncio.sleep(0.2)  # the last accepts reach the broker
            async with http.get(pipe, headers={"Accept": JSON}) as reply:
                listing = await json_reply(reply, (200,))
        finally:
            await delete_bridge(http, base, name)
            await rest.delete(http, pipe)
    held = len([m for m in listing["restms"]["pipe"][0].get("message", []) if "async" not in m])
    if counters["published"] != count or counters["refused"] or counters["unroutable"] or not held:
        raise BenchError(f"bridge {name}: {counters}, pipe lists {held}")
    return {
        "count": count,
        "seconds": seconds,
        "msg_per_s": count / seconds,
        "throttled": counters["throttled"],
    }


# ---------------------------------------------------------------- rounds
def _timed(server: Server, work: Any) -> dict[str, Any]:
    """Run ``work()`` with the gateway's CPU and the machine's business recorded."""
    ticks0, cpu0 = system_ticks(), cpu_seconds(server.pid)
    result: dict[str, Any] = work()
    result["gateway_cpu_s"] = cpu_seconds(server.pid) - cpu0
    result["machine_busy"] = machine_busy(ticks0, system_ticks())
    return result


def _raw(work: Any) -> dict[str, Any]:
    ticks0 = system_ticks()
    result: dict[str, Any] = work()
    result["machine_busy"] = machine_busy(ticks0, system_ticks())
    return result


def _one_round(
    gateway: Server,
    queues: Queues,
    q: dict[str, str],
    bridge: str,
    count: int,
    serial: int,
    attempt: int,
) -> dict[str, Any]:
    """Both directions, raw and bridge taking turns (raw first on even ``serial``)."""
    base = gateway.base
    queues.purge(q["out_bridge"])
    # A fresh queue for each inbound bridge: a deleted bridge's AMQP connection stays
    # open in the gateway with its unused credit (docs/BENCHMARKS.md, section 9), and
    # RabbitMQ would hand it up to a window of the next preload, never to be settled.
    queues.drop(q["in_bridge"])
    q["in_bridge"] = queues.new("in-bridge")
    out: dict[str, Any] = {}

    def out_raw() -> dict[str, Any]:
        queues.purge(q["out_raw"])
        return _raw(RawSender(q["out_raw"], count).run)

    def out_bridge() -> dict[str, Any]:
        result = _timed(gateway, lambda: uvloop.run(publish_outbound(base, bridge, count)))
        queues.purge(q["out_bridge"])
        return result

    def in_raw() -> dict[str, Any]:
        receiver = RawReceiver(q["in_raw"], count)
        result = _raw(receiver.run)
        if not receiver.size_ok:
            raise BenchError("the raw receiver got a message that is not 1 KiB")
        return result

    def in_bridge() -> dict[str, Any]:
        name = serial * 10 + attempt
        work = run_inbound(base, q["in_bridge"], count, name)
        result = _timed(gateway, lambda: uvloop.run(work))
        left = queues.depth(q["in_bridge"])
        if left:
            raise BenchError(f"{left} messages left in the inbound bridge's queue")
        return result

    order = ("raw", "bridge") if serial % 2 == 0 else ("bridge", "raw")
    for kind in order:
        out[f"out_{kind}"] = out_raw() if kind == "raw" else out_bridge()
    queues.preload(q["in_raw"], count)
    out["preload"] = queues.preload(q["in_bridge"], count)
    for kind in order:
        out[f"in_{kind}"] = in_raw() if kind == "raw" else in_bridge()
    for direction in ("out", "in"):
        raw, bridged = out[f"{direction}_raw"], out[f"{direction}_bridge"]
        out[f"{direction}_ratio"] = bridged["msg_per_s"] / raw["msg_per_s"]
        bridged["gateway_cpu_us_per_msg"] = bridged["gateway_cpu_s"] / count * 1e6
    return out


def _log_round(label: str, r: dict[str, Any]) -> None:
    o, i = r["out_bridge"], r["in_bridge"]
    log(
        f"  {label}: out bridge {o['msg_per_s']:7,.0f} raw {r['out_raw']['msg_per_s']:7,.0f} "
        f"msg/s ratio {r['out_ratio']:.3f} (HTTP {o['http_msg_per_s']:,.0f} msg/s, gateway "
        f"{o['gateway_cpu_us_per_msg']:.0f} CPU-us/msg) | in bridge {i['msg_per_s']:7,.0f} "
        f"raw {r['in_raw']['msg_per_s']:7,.0f} msg/s ratio {r['in_ratio']:.3f} (gateway "
        f"{i['gateway_cpu_us_per_msg']:.0f} CPU-us/msg) busy {o['machine_busy']:.0%}"
        f"/{i['machine_busy']:.0%}"
    )


def _gateway_rounds(env: dict[str, str], rounds: int, count: int, label: str) -> dict[str, Any]:
    queues = Queues()
    gateway = start("gateway", env)
    try:
        roles = ("out_raw", "out_bridge", "in_raw", "in_bridge")
        q = {role: queues.new(role.replace("_", "-")) for role in roles}
        bridge = uvloop.run(_prepare(gateway.base, q["out_bridge"], count))
        uvloop.run(wait_empty(gateway.base, bridge))
        queues.purge(q["out_bridge"])
        RawSender(q["out_raw"], max(BATCH, count // 10)).run()  # the baseline's warm-up
        out: list[dict[str, Any]] = []
        retried = 0
        for n in range(rounds):
            for attempt in range(ATTEMPTS):
                try:
                    result = _one_round(gateway, queues, q, bridge, count, n, attempt)
                    break
                except (BenchError, pika.exceptions.AMQPError) as exc:
                    # the shared broker was restarted under us (other suites' tests do
                    # that): the round's figures mean nothing, so it is run again
                    if attempt == ATTEMPTS - 1 or not gateway.alive():
                        raise
                    retried += 1
                    log(f"  {label} round {n + 1} failed ({exc}); running it again")
                    uvloop.run(wait_empty(gateway.base, bridge))
            result["round"] = n
            out.append(result)
            _log_round(f"{label} round {n + 1}/{rounds}", result)
        if not gateway.alive():
            raise BenchError("the gateway died")
        return {"rounds": out, "retried": retried}
    finally:
        gateway.stop()
        queues.close()


async def _prepare(base: str, out_queue: str, count: int) -> str:
    """Both feeds and the outbound bridge (warmed up); its name."""
    async with aiohttp.ClientSession() as http:
        await rest.create_feed(http, base, IN_FEED)
    return await setup_outbound(base, out_queue, count)


async def wait_empty(base: str, name: str) -> None:
    """Until the outbound bridge's pipe is empty (the warm-up acknowledged)."""
    async with aiohttp.ClientSession() as http:
        deadline = time.monotonic() + TIMEOUT
        while (await bridge_status(http, base, name))["backlog"]:
            if time.monotonic() > deadline:
                raise BenchError(f"bridge {name} never emptied its pipe")
            await asyncio.sleep(POLL)


def settings(env: dict[str, str], store: str) -> dict[str, Any]:
    return {
        "gateway": "own process (main.py serve)",
        "store": store,
        "store_sync": env.get("RESTMS_STORE_SYNC", "full (default)"),
        "memory_budget": env.get("RESTMS_MEMORY_BUDGET", "64 MiB (default)"),
        "window": WINDOW,
        "max_pipe_messages": env["RESTMS_MAX_PIPE_MESSAGES"],
        "batch": BATCH,
        "posts_in_flight": POSTS_IN_FLIGHT,
    }


def run(rounds: int, count: int, memory_round: bool = True) -> dict[str, Any]:
    """The rounds on a gateway with its default SQLite store, then (for contrast) one
    round on a gateway with ``store = "memory"``."""
    env = {
        "RESTMS_GUEST_SCOPES": GUEST_SCOPES,
        "RESTMS_RATE_LIMIT": "0",
        "RESTMS_MAX_PIPE_MESSAGES": str(max(100_000, 4 * count)),
    }
    out: dict[str, Any] = {"count": count, "target": TARGET, "payload_bytes": len(payload())}
    out["settings"] = settings(env, "sqlite (default)")
    log("  " + ", ".join(f"{k}={v}" for k, v in out["settings"].items()))
    t0 = time.monotonic()
    sqlite = _gateway_rounds(env, rounds, count, "sqlite")
    out["sqlite"], out["retried"] = sqlite["rounds"], sqlite["retried"]
    for direction in ("out", "in"):
        ratios = [r[f"{direction}_ratio"] for r in out["sqlite"]]
        out[f"{direction}_ratios"] = ratios
        out[f"{direction}_ratio"] = median(ratios)
        for kind in ("raw", "bridge"):
            out[f"{direction}_{kind}_median"] = median(
                [r[f"{direction}_{kind}"]["msg_per_s"] for r in out["sqlite"]]
            )
        log(
            f"  {direction}: bridge/raw per round {' '.join(f'{x:.3f}' for x in ratios)}; "
            f"median {out[f'{direction}_ratio']:.3f} (target >= {TARGET}) -> "
            f"{'PASS' if out[f'{direction}_ratio'] >= TARGET else 'FAIL'}"
        )
    if memory_round:
        memory_env = {**env, "RESTMS_STORE": "memory"}
        out["memory"] = _gateway_rounds(memory_env, 1, count, "memory")["rounds"]
    out["seconds"] = time.monotonic() - t0
    log(
        f"  {out['seconds']:.0f} s in all; rounds run again after a broker restart: "
        f"{out['retried']}"
    )
    return out
