"""Benchmark 12: WebSocket fan-out, publish -> 1,000 WebSocket clients.

One fanout feed joined by ``pipes`` (1,000) default pipes; each pipe is read by one
WebSocket client (``GET`` of the pipe URI, ``Upgrade: websocket``, subprotocol
``restms.v1``). The clients run in ``procs`` separate spawned processes (asyncio on
uvloop, aiohttp's client), spread evenly. Every message a client receives is
acknowledged at once with an ``ack`` frame (without an ``id``: not answered), as a
browser page would (``ack_every`` N: only every Nth, which acknowledges the ones
before it too). The gateway runs in its own process (:func:`bench.common.start`)
with its default store (SQLite); the bench raises the per-principal and per-address
limits it would otherwise hit (:data:`GATEWAY_ENV`): all clients are the loopback guest.

Each message is one JSON publish (``POST`` to the feed, one message of 1 KiB) made by
this process, whose ``message_id`` carries the round's phase, a sequence number and
``time.monotonic_ns()`` taken just before the request is written; CLOCK_MONOTONIC is
the same clock in every process on the machine, so a client's receive time minus it
is the publish -> delivery latency, request and routing included.

* **steady**: ``rate`` messages a second for ``seconds`` seconds, each POST sent on
  schedule (one keep-alive connection, the next one as soon as its time comes and the
  previous reply is in). Latency p50, p99 and max over every delivery, and deliveries
  per second over the phase.
* **burst**: ``burst`` messages published back to back; throughput is every client's
  deliveries over the time from the first publish to the last delivery.

Baseline, in the same round and on the same machine: the same client processes on a
bare aiohttp + uvloop WebSocket server (:func:`_bare_main`, spawned) that broadcasts
each POSTed body as it is, in one text frame, to every socket, and reads and drops the
clients' ``ack`` frames. It does no routing, keeps no queue, leases nothing and writes
nothing to disk: it is the floor of aiohttp's own cost for the same traffic.

Every client checks its messages: each phase's sequence numbers arrive once each and
in order. A phase ends when every client has all of them, or after :data:`STALL`
seconds without a delivery (then the missing ones are reported). Each round runs both
servers, the order flipping every round; the figures are medians over rounds, and the
ratios gateway / baseline are reported per round and as the median of those.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing
import time
from array import array
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import orjson
import uvloop
from aiohttp import WSMsgType, web

from bench import rest
from bench.common import (
    HOST,
    JSON,
    BenchError,
    cpu_seconds,
    log,
    machine_busy,
    median,
    payload,
    percentile,
    start,
    system_ticks,
)

PROTOCOL = "restms.v1"
STALL = 10.0  # seconds without a delivery before a client gives up on a phase
READY = 60.0  # seconds the clients may take to connect
CONNECT_AT_ONCE = 64  # connections a client process opens at a time
SIZE = 1024  # bytes of each message's content
GATEWAY_ENV = {
    "RESTMS_RATE_LIMIT": "0",  # setting up 1,000 pipes and joins is 2,000 requests
    "RESTMS_MAX_PIPES_PER_PRINCIPAL": "10000",
    "RESTMS_WEBSOCKET_MAX_PER_PRINCIPAL": "10000",
    "RESTMS_MAX_CONNECTIONS_PER_IP": "10000",
    "RESTMS_MAX_CONNECTIONS": "20000",
}
KINDS = ("bare", "gateway")


# ---------------------------------------------------------------- the client processes
class _Phase:
    """What one client process has received in one phase."""

    def __init__(self, sockets: int, expected: int) -> None:
        self.expected = expected  # messages each socket must get
        self.latency = array("q")  # ns, one per delivery
        self.next = [0] * sockets  # the sequence number each socket expects next
        self.unordered = 0
        self.repeats = 0
        self.received = 0
        self.first = 0  # monotonic ns of the first and last deliveries
        self.last = 0
        self.done = asyncio.Event()
        if expected == 0:
            self.done.set()

    def take(self, index: int, seq: int, sent: int, now: int) -> None:
        self.latency.append(now - sent)
        self.received += 1
        if not self.first:
            self.first = now
        self.last = now
        want = self.next[index]
        if seq < want:
            self.repeats += 1
            return
        if seq != want:
            self.unordered += 1
        self.next[index] = seq + 1
        if self.received >= self.expected * len(self.next):
            self.done.set()

    def report(self) -> dict[str, Any]:
        return {
            "received": self.received,
            "sockets_short": sum(1 for n in self.next if n < self.expected),
            "unordered": self.unordered,
            "repeats": self.repeats,
            "first": self.first,
            "last": self.last,
            "latency_ns": self.latency.tobytes(),
        }


async def _reader(
    index: int, ws: aiohttp.ClientWebSocketResponse, phases: dict[str, _Phase], ack_every: int
) -> None:
    unacknowledged = 0
    async for frame in ws:
        now = time.monotonic_ns()
        if frame.type is not WSMsgType.TEXT:
            continue
        data = orjson.loads(frame.data)
        message = data["restms"]["message"][0]
        phase, seq, sent = message["message_id"].split("-")
        found = phases.get(phase)
        if found is not None:
            found.take(index, int(seq), int(sent), now)
        unacknowledged += 1
        if unacknowledged >= ack_every:  # the newest acknowledges every older one too
            unacknowledged = 0
            position = data.get("position", int(seq))
            await ws.send_str(f'{{"type":"ack","position":{position}}}')


async def _clients(conn: Connection, urls: list[str], ack_every: int) -> None:
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as http:
        gate = asyncio.Semaphore(CONNECT_AT_ONCE)

        async def open_one(url: str) -> aiohttp.ClientWebSocketResponse:
            async with gate:
                return await http.ws_connect(url, protocols=(PROTOCOL,), max_msg_size=0)

        sockets = await asyncio.gather(*(open_one(url) for url in urls))
        phases: dict[str, _Phase] = {}
        readers = [
            asyncio.create_task(_reader(n, ws, phases, ack_every)) for n, ws in enumerate(sockets)
        ]
        conn.send(("ready", len(sockets)))
        try:
            while True:
                command = await asyncio.to_thread(_next_command, conn)
                if command is None:
                    break
                op, phase, expected = command
                if op == "arm":
                    phases[phase] = _Phase(len(sockets), expected)
                    conn.send(("armed", phase))
                else:  # "wait"
                    conn.send(("result", await _settle(phases[phase])))
        finally:
            for ws in sockets:
                await ws.close()
            for task in readers:
                task.cancel()
            await asyncio.gather(*readers, return_exceptions=True)


def _next_command(conn: Connection) -> Any:
    return conn.recv() if conn.poll(READY * 10) else None


async def _settle(phase: _Phase) -> dict[str, Any]:
    """Wait until the phase is complete, or :data:`STALL` seconds pass with no delivery."""
    while not phase.done.is_set():
        seen = phase.received
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(phase.done.wait(), STALL)
        if phase.received == seen:
            break
    return phase.report()


def _client_main(conn: Connection, urls: list[str], ack_every: int) -> None:
    try:
        uvloop.run(_clients(conn, urls, ack_every))
    except Exception as exc:  # reported to the bench, which fails the section
        conn.send(("error", repr(exc)))


class Clients:
    """The bench's end of the client processes."""

    def __init__(self, urls: list[str], procs: int, ack_every: int = 1) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.ends: list[Connection] = []
        self.procs: list[Any] = []
        for n in range(procs):
            mine, theirs = spawn.Pipe()
            share = urls[n::procs]
            proc = spawn.Process(
                target=_client_main,
                args=(theirs, share, ack_every),
                name=f"ws-clients-{n}",
                daemon=True,
            )
            proc.start()
            theirs.close()
            self.ends.append(mine)
            self.procs.append(proc)
        self.count: int = self._expect("ready", READY)

    def _expect(self, what: str, timeout: float) -> Any:
        values = []
        for end in self.ends:
            if not end.poll(timeout):
                raise BenchError(f"clients: no {what} within {timeout:g} s")
            tag, value = end.recv()
            if tag != what:
                raise BenchError(f"clients: {tag} {value!r} instead of {what}")
            values.append(value)
        return sum(values) if what == "ready" else values

    def arm(self, phase: str, expected: int) -> None:
        for end in self.ends:
            end.send(("arm", phase, expected))
        self._expect("armed", READY)

    def results(self, phase: str, timeout: float) -> list[dict[str, Any]]:
        for end in self.ends:
            end.send(("wait", phase, 0))
        results: list[dict[str, Any]] = self._expect("result", timeout)
        return results

    def close(self) -> None:
        for end, proc in zip(self.ends, self.procs, strict=True):
            if proc.is_alive():
                with contextlib.suppress(OSError):
                    end.send(None)
                proc.join(10)
            if proc.is_alive():
                proc.kill()
                proc.join(5)
            end.close()


# ---------------------------------------------------------------- the baseline server
async def _bare(conn: Connection) -> None:
    sockets: set[web.WebSocketResponse] = set()

    async def socket(request: web.Request) -> web.StreamResponse:
        ws = web.WebSocketResponse(protocols=(PROTOCOL,), max_msg_size=1 << 20)
        await ws.prepare(request)
        sockets.add(ws)
        try:
            async for _ in ws:  # the clients' acks: read and dropped
                pass
        finally:
            sockets.discard(ws)
        return ws

    async def broadcast(request: web.Request) -> web.Response:
        data = await request.read()
        for ws in list(sockets):
            with contextlib.suppress(ConnectionError):
                await ws.send_frame(data, WSMsgType.TEXT)
        return web.json_response({"count": len(sockets)})

    app = web.Application(client_max_size=1 << 20)
    app.router.add_get("/ws/{n}", socket)
    app.router.add_post("/publish", broadcast)
    runner = web.AppRunner(app, handler_cancellation=True, access_log=None, shutdown_timeout=2)
    await runner.setup()
    site = web.TCPSite(runner, HOST, 0, backlog=4096)
    await site.start()
    conn.send(("port", runner.addresses[0][1]))
    await asyncio.to_thread(conn.recv)  # anything, or EOF: stop
    await runner.cleanup()


def _bare_main(conn: Connection) -> None:
    with contextlib.suppress(EOFError, KeyboardInterrupt):
        uvloop.run(_bare(conn))


class Bare:
    def __init__(self) -> None:
        spawn = multiprocessing.get_context("spawn")
        self.conn, theirs = spawn.Pipe()
        self.proc = spawn.Process(target=_bare_main, args=(theirs,), name="ws-bare", daemon=True)
        self.proc.start()
        theirs.close()
        if not self.conn.poll(READY):
            raise BenchError("the bare WebSocket server did not start")
        _, self.port = self.conn.recv()

    @property
    def pid(self) -> int:
        return int(self.proc.pid or 0)

    def stop(self) -> None:
        with contextlib.suppress(OSError):
            self.conn.send(None)
        self.proc.join(10)
        if self.proc.is_alive():
            self.proc.kill()
            self.proc.join(5)
        self.conn.close()


# ---------------------------------------------------------------- the publisher
def _body(phase: str, seq: int) -> bytes:
    message = {
        "address": "bench",
        "message_id": f"{phase}-{seq}-{time.monotonic_ns()}",
        "content": [{"type": "text/plain", "value": payload(SIZE)}],
    }
    return orjson.dumps({"restms": {"message": [message]}})


async def _publish(url: str, phase: str, count: int, rate: float | None) -> dict[str, Any]:
    """``count`` POSTs to ``url``, at ``rate`` a second (None: back to back)."""
    async with aiohttp.ClientSession() as http:
        start_ns = time.monotonic_ns()
        t0 = time.monotonic()
        late = 0
        for seq in range(count):
            if rate is not None:
                wait = t0 + seq / rate - time.monotonic()
                if wait > 0:
                    await asyncio.sleep(wait)
                elif wait < -1 / rate:
                    late += 1
            async with http.post(url, data=_body(phase, seq), headers={"Content-Type": JSON}) as r:
                reply = await r.read()
                if r.status != 200:
                    raise BenchError(f"publish {seq} -> {r.status}: {reply[:200]!r}")
        return {"start_ns": start_ns, "seconds": time.monotonic() - t0, "late": late}


# ---------------------------------------------------------------- one server, one round
async def _gateway_pipes(base: str, count: int) -> tuple[str, list[str]]:
    """A fanout feed, ``count`` pipes joined to it: (the feed URI, the pipe URIs)."""
    connector = aiohttp.TCPConnector(limit=64)
    async with aiohttp.ClientSession(connector=connector) as http:
        feed = await rest.create_feed(http, base, "bench-ws-fanout")
        made = await asyncio.gather(*(rest.create_pipe(http, base) for _ in range(count)))
        pipes = [pipe for pipe, _ in made]
        await asyncio.gather(*(rest.join(http, pipe, feed) for pipe in pipes))
    return feed, pipes


def _phase(
    clients: Clients, url: str, name: str, count: int, rate: float | None, pid: int
) -> dict[str, Any]:
    clients.arm(name, count)
    ticks0, cpu0 = system_ticks(), cpu_seconds(pid)
    sent = uvloop.run(_publish(url, name, count, rate))
    reports = clients.results(name, STALL + 60 + count / (rate or 1000))
    busy = machine_busy(ticks0, system_ticks())
    cpu = cpu_seconds(pid) - cpu0
    received = sum(r["received"] for r in reports)
    expected = count * clients.count
    first = min((r["first"] for r in reports if r["first"]), default=0)
    last = max((r["last"] for r in reports), default=0)
    span = (last - sent["start_ns"]) / 1e9 if last else 0.0
    latency = array("q")
    for r in reports:
        latency.frombytes(r["latency_ns"])
    ms = [ns / 1e6 for ns in sorted(latency)]
    return {
        "phase": name,
        "messages": count,
        "rate": rate,
        "expected": expected,
        "received": received,
        "lost": expected - received + sum(r["repeats"] for r in reports),
        "unordered": sum(r["unordered"] for r in reports),
        "repeats": sum(r["repeats"] for r in reports),
        "sockets_short": sum(r["sockets_short"] for r in reports),
        "publish_s": sent["seconds"],
        "late_publishes": sent["late"],
        "first_delivery_s": (first - sent["start_ns"]) / 1e9 if first else None,
        "span_s": span,
        "deliveries_per_s": received / span if span > 0 else 0.0,
        "p50_ms": percentile(ms, 50) or 0.0,
        "p99_ms": percentile(ms, 99) or 0.0,
        "max_ms": ms[-1] if ms else 0.0,
        "server_cpu_s": cpu,
        "server_cpu_us_per_delivery": cpu / received * 1e6 if received else None,
        "machine_busy": busy,
    }


def _round(kind: str, n: int, args: dict[str, Any]) -> dict[str, Any]:
    pipes, procs = args["pipes"], args["procs"]
    clients: Clients | None = None
    server: Any = None
    try:
        if kind == "gateway":
            server = start("gateway", GATEWAY_ENV)
            feed, uris = uvloop.run(_gateway_pipes(server.base, pipes))
            url, pid = feed, server.pid
            urls = [uri.replace("http://", "ws://", 1) for uri in uris]
        else:
            server = Bare()
            base = f"http://{HOST}:{server.port}"
            url, pid = f"{base}/publish", server.pid
            urls = [f"ws://{HOST}:{server.port}/ws/{i}" for i in range(pipes)]
        clients = Clients(urls, procs, args["ack_every"])
        if clients.count != pipes:
            raise BenchError(f"{kind}: {clients.count} of {pipes} sockets opened")
        warm = _phase(clients, url, f"w{n}", 5, 10.0, pid)  # not recorded, but checked
        if warm["received"] != warm["expected"]:
            raise BenchError(f"{kind} warm-up: {warm['received']} of {warm['expected']}")
        steady = _phase(clients, url, f"s{n}", args["rate"] * args["seconds"], args["rate"], pid)
        burst = _phase(clients, url, f"b{n}", args["burst"], None, pid)
        if kind == "gateway" and not server.alive():
            raise BenchError("the gateway died")
        return {"kind": kind, "round": n, "steady": steady, "burst": burst}
    finally:
        if clients is not None:
            clients.close()
        if server is not None:
            server.stop()


def describe(r: dict[str, Any]) -> str:
    """One line for one server's round: both phases, CPU, losses, machine load."""
    s, b = r["steady"], r["burst"]
    return (
        f"round {r['round'] + 1} {r['kind']:7s}: steady {s['rate']:g} msg/s -> "
        f"{s['deliveries_per_s']:,.0f} deliveries/s, p50 {s['p50_ms']:.2f} ms, p99 "
        f"{s['p99_ms']:.2f} ms, max {s['max_ms']:.1f} ms "
        f"({s['server_cpu_us_per_delivery'] or 0:.1f} CPU-us/delivery); burst "
        f"{b['messages']} -> {b['deliveries_per_s']:,.0f} "
        f"deliveries/s in {b['span_s']:.2f} s ({b['server_cpu_us_per_delivery'] or 0:.1f} "
        f"CPU-us/delivery); lost {s['lost'] + b['lost']}, out of order "
        f"{s['unordered'] + b['unordered']}; busy {s['machine_busy']:.0%}/{b['machine_busy']:.0%}"
    )


def run(
    rounds: int,
    pipes: int = 1000,
    rate: int = 5,
    seconds: int = 10,
    burst: int = 100,
    procs: int = 2,
    ack_every: int = 1,
) -> dict[str, Any]:
    """``rounds`` rounds of both servers; the per-round figures and their medians."""
    args = {
        "pipes": pipes,
        "rate": rate,
        "seconds": seconds,
        "burst": burst,
        "procs": procs,
        "ack_every": ack_every,
    }
    out: dict[str, Any] = {"settings": {**args, "size": SIZE, "gateway_env": GATEWAY_ENV}}
    log("  " + ", ".join(f"{k}={v}" for k, v in args.items()))
    t0 = time.monotonic()
    out["rounds"] = []
    for n in range(rounds):
        order = KINDS if n % 2 == 0 else KINDS[::-1]
        pair = {kind: _round(kind, n, args) for kind in order}
        for kind in KINDS:
            log(f"  {describe(pair[kind])}")
        out["rounds"].append(pair)
    out["seconds"] = time.monotonic() - t0
    summarize(out)
    return out


def summarize(out: dict[str, Any]) -> None:
    """Medians per server and phase, and the gateway / baseline ratios per round."""
    rounds = out["rounds"]
    for kind in KINDS:
        for phase in ("steady", "burst"):
            runs = [r[kind][phase] for r in rounds]
            for key in ("p50_ms", "p99_ms", "max_ms", "deliveries_per_s"):
                out[f"{kind}_{phase}_{key}"] = median([x[key] for x in runs])
            out[f"{kind}_{phase}_cpu_us"] = median(
                [x["server_cpu_us_per_delivery"] or 0 for x in runs]
            )
            out[f"{kind}_{phase}_lost"] = sum(x["lost"] for x in runs)
            out[f"{kind}_{phase}_unordered"] = sum(x["unordered"] for x in runs)
    for key in ("steady_p50_ms", "steady_p99_ms", "burst_deliveries_per_s"):
        phase, metric = key.split("_", 1)
        ratios = [r["gateway"][phase][metric] / r["bare"][phase][metric] for r in rounds]
        out[f"ratio_{key}"] = ratios
        out[f"ratio_{key}_median"] = median(ratios)
    log(
        "  medians: steady p50 gateway {:.2f} / bare {:.2f} ms (x{:.1f}), p99 {:.2f} / {:.2f} ms "
        "(x{:.1f}); burst {:,.0f} / {:,.0f} deliveries/s ({:.2f} of bare); {:.0f} s in all".format(
            out["gateway_steady_p50_ms"],
            out["bare_steady_p50_ms"],
            out["ratio_steady_p50_ms_median"],
            out["gateway_steady_p99_ms"],
            out["bare_steady_p99_ms"],
            out["ratio_steady_p99_ms_median"],
            out["gateway_burst_deliveries_per_s"],
            out["bare_burst_deliveries_per_s"],
            out["ratio_burst_deliveries_per_s_median"],
            out["seconds"],
        )
    )


if __name__ == "__main__":
    import argparse
    import json
    import resource

    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--pipes", type=int, default=1000)
    parser.add_argument("--rate", type=int, default=5)
    parser.add_argument("--seconds", type=int, default=10)
    parser.add_argument("--burst", type=int, default=100)
    parser.add_argument("--procs", type=int, default=2)
    parser.add_argument("--ack-every", type=int, default=1, help="acknowledge every Nth")
    options = parser.parse_args()
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    result = run(
        options.rounds,
        options.pipes,
        options.rate,
        options.seconds,
        options.burst,
        options.procs,
        options.ack_every,
    )
    print(json.dumps({k: v for k, v in result.items() if k != "rounds"}, indent=2))
