"""Benchmark 10: the ZeroMQ bridge's throughput, msg/s of 1 KiB messages.

The gateway runs in its own process (:func:`bench.common.start`, as in benchmarks
1-9) with its default store (SQLite). The loopback guest is given ``restms:admin``
(``RESTMS_GUEST_SCOPES``) so the benchmark can make the bridges with
``POST /admin/bridges`` (the same definitions a ``[[bridges]]`` entry with
``kind = "zeromq"`` takes) and read their counters. Every bridge binds
``tcp://127.0.0.1:*``; the benchmark reads the port it got from the bridge's status,
and the external peers connect to it. The peers are two worker processes of their
own (:func:`_peer`, plain blocking pyzmq), one sending and one receiving, started once
and given one run at a time over a pipe.

Every message is 1 KiB of text with a sequence number at its start, sent as the
gateway's three frames ``[address, envelope, body]`` (bridges/zmq_wire.py:
``[b"bench.zmq", b'{"v":1,"t":"text/plain"}', body]``, what the gateway itself sends
for such a message). The receiver checks each message's frames and counts losses,
repeats and messages out of order. A run's throughput is what the receiver got over
the time from its first to its last message.

* **raw, 3 frames** (the baseline the target is judged against: the same bytes on
  the wire): an external PUSH sends ``count`` messages straight to an external PULL.
* **raw, 1 frame**: the same with the 1 KiB body alone, for information.
* **path B**, external PUSH -> ``pull`` bridge -> topic feed -> ``push`` bridge (join
  address ``#``, ``at_hwm = "block"``) -> external PULL.
* **path A**, external PUSH -> ``pull`` bridge -> topic feed -> ``pub`` bridge (join
  address ``#``, ``at_hwm = "block"``: XPUB_NODROP) -> external SUB (subscribed to
  everything, its ``rcvhwm`` above ``count``). The sender starts once the bridge has
  seen the subscription.

Each round runs all four, baseline and bridges taking turns (the order flips every
round); the figure that counts is the median over rounds of each round's
path / raw-3-frame ratio. Every run is bounded: a receiver that gets nothing for
:data:`STALL` seconds ends with what it has, and a run that does not report within
:data:`TIMEOUT` seconds fails the section. After each bridge run the bridges'
counters must show every message received, published and sent once, none dropped.
"""

from __future__ import annotations

import asyncio
import time
from multiprocessing.connection import Connection
from typing import Any

import aiohttp
import uvloop
import zmq

from bench import rest
from bench.common import (
    PAYLOAD_SIZE,
    BenchError,
    Child,
    Server,
    cpu_seconds,
    json_reply,
    log,
    machine_busy,
    median,
    payload,
    play_rounds,
    start,
    system_ticks,
)

TARGET = 0.25  # bridge path msg/s at least this share of raw PUSH -> PULL (3 frames)
STALL = 10.0  # seconds a receiver may get nothing before it gives up
TIMEOUT = 120.0  # seconds any one run may take, from "go" to both peers' reports
READY = 20.0  # seconds a peer may take to start, or a bridge to come up or see a peer
POLL = 0.025  # seconds between reads of a bridge's status
ADDRESS = b"bench.zmq"
ENVELOPE = b'{"v":1,"t":"text/plain"}'  # zmq_wire.encode's, for one text/plain content
SEQ_DIGITS = 10  # the body starts with the sequence number: 10 digits and a space
TAIL = payload(PAYLOAD_SIZE)[SEQ_DIGITS + 1 :].encode()
GUEST_SCOPES = "restms:read restms:publish restms:subscribe restms:admin"
PATHS = {  # path -> (its feed, its inbound bridge, its outbound bridge, socket)
    "b": ("bench-zmq-b", "bench-zmq-b-pull", "bench-zmq-b-push", "push"),
    "a": ("bench-zmq-a", "bench-zmq-a-pull", "bench-zmq-a-pub", "pub"),
}
RUNS = ("raw3", "b", "raw1", "a")  # a round's order; every other round backwards
LABELS = {
    "raw3": "raw PUSH -> PULL, 3 frames",
    "raw1": "raw PUSH -> PULL, 1 frame",
    "b": "B: PUSH -> pull bridge -> feed -> push bridge -> PULL",
    "a": "A: PUSH -> pull bridge -> feed -> pub bridge -> SUB",
}


# ---------------------------------------------------------------- the peer processes
def body(seq: int) -> bytes:
    return b"%010d " % seq + TAIL


def _push(ctx: zmq.Context[Any], conn: Connection, endpoint: str, count: int, frames: int) -> Any:
    """Connect a PUSH to ``endpoint``, say ready, wait for go, send ``count``."""
    sock = ctx.socket(zmq.PUSH)
    sock.setsockopt(zmq.LINGER, int(STALL * 1000))  # what is queued still goes out
    sock.setsockopt(zmq.SNDTIMEO, int(STALL * 1000))  # a send blocked that long: failed
    try:
        sock.connect(endpoint)
        conn.send(("ready", endpoint))
        if not conn.poll(READY) or conn.recv() != "go":
            return {"error": "no go from the benchmark"}
        sent = 0
        first = time.perf_counter()
        try:
            if frames == 3:
                for seq in range(count):
                    sock.send_multipart((ADDRESS, ENVELOPE, body(seq)))
                    sent += 1
            else:
                for seq in range(count):
                    sock.send(body(seq))
                    sent += 1
        except zmq.Again:
            return {"error": f"a send blocked for {STALL:g} s after {sent} messages"}
        return {"sent": sent, "first": first, "last": time.perf_counter()}
    finally:
        sock.close()


def _pull(
    ctx: zmq.Context[Any],
    conn: Connection,
    kind: str,
    endpoint: str,
    count: int,
    frames: int,
) -> Any:
    """A PULL (bound, or connected to a bridge) or a SUB (connected); receive until
    ``count`` or :data:`STALL` seconds of silence, checking every message."""
    sock = ctx.socket(zmq.SUB if kind == "sub" else zmq.PULL)
    sock.setsockopt(zmq.LINGER, 0)
    sock.setsockopt(zmq.RCVTIMEO, int(STALL * 1000))
    if kind == "sub":
        sock.setsockopt(zmq.RCVHWM, count + 1000)  # never the SUB's reason to drop
        sock.setsockopt(zmq.SUBSCRIBE, b"")
    try:
        if endpoint.endswith(":*"):
            sock.bind(endpoint)
            endpoint = sock.getsockopt_string(zmq.LAST_ENDPOINT)
        else:
            sock.connect(endpoint)
        conn.send(("ready", endpoint))
        seen = bytearray(count)
        received = repeats = unordered = bad = 0
        first = last = 0.0
        expected = 0
        deadline = time.monotonic() + TIMEOUT
        while received < count and time.monotonic() < deadline:
            try:
                parts = sock.recv_multipart()
            except zmq.Again:
                break
            last = time.perf_counter()
            if not received:
                first = last
            received += 1
            data = parts[-1]
            if len(parts) != frames or len(data) != PAYLOAD_SIZE:
                bad += 1
                continue
            if frames == 3 and (parts[0] != ADDRESS or parts[1] != ENVELOPE):
                bad += 1
                continue
            seq = int(data[:SEQ_DIGITS])
            if seq >= count or seen[seq]:
                repeats += 1
                continue
            seen[seq] = 1
            if seq != expected:
                unordered += 1
            expected = seq + 1
        return {
            "received": received,
            "unique": received - repeats - bad,
            "repeats": repeats,
            "bad": bad,
            "unordered": unordered,
            "first": first,
            "last": last,
        }
    finally:
        sock.close()


def _peer(conn: Connection) -> None:
    """A worker process: runs ``(op, arguments)`` commands until ``None`` (or until
    the benchmark has said nothing for :data:`TIMEOUT` seconds)."""
    ctx: zmq.Context[Any] = zmq.Context()
    try:
        while conn.poll(TIMEOUT):
            try:
                command = conn.recv()
            except EOFError:  # the benchmark is gone
                break
            if command is None:
                break
            op, arguments = command
            try:
                result = (_push if op == "push" else _pull)(ctx, conn, **arguments)
            except zmq.ZMQError as exc:
                result = {"error": f"{op}: {exc!r}"}
            conn.send(("result", result))
    finally:
        ctx.term()


class Peer(Child):
    """The benchmark's end of one worker process."""

    def __init__(self, name: str) -> None:
        super().__init__(name, _peer)

    def command(self, op: str, **arguments: Any) -> None:
        self.conn.send((op, arguments))

    def go(self) -> None:
        self.conn.send("go")


# ---------------------------------------------------------------- the gateway side
async def bridge_status(base: str, name: str) -> dict[str, Any]:
    async with (
        aiohttp.ClientSession() as http,
        http.get(f"{base}/admin/bridges/{name}") as reply,
    ):
        status: dict[str, Any] = await json_reply(reply, (200,))
        return status


async def wait_status(base: str, name: str, what: str, ok: Any) -> dict[str, Any]:
    """Poll the bridge until ``ok(status)``, at most :data:`READY` seconds."""
    deadline = time.monotonic() + READY
    while not ok(status := await bridge_status(base, name)):
        if time.monotonic() > deadline:
            raise BenchError(f"bridge {name}: {what} within {READY:g} s: {status}")
        await asyncio.sleep(POLL)
    return status


async def setup(base: str, durable: bool) -> dict[str, str]:
    """Each path's topic feed and its two bridges (up); the bridges' endpoints."""
    endpoints: dict[str, str] = {}
    async with aiohttp.ClientSession() as http:
        for feed, inbound, outbound, socket in PATHS.values():
            await rest.create_feed(http, base, feed, "topic")
            for name, own in (
                (inbound, {"socket": "pull"}),
                (
                    outbound,
                    {"socket": socket, "address": "#", "at_hwm": "block", "durable": durable},
                ),
            ):
                definition = {
                    "kind": "zeromq",
                    "name": name,
                    "feed": feed,
                    "endpoints": ["tcp://127.0.0.1:*"],
                    "bind": True,
                    **own,
                }
                async with http.post(f"{base}/admin/bridges", json=definition) as reply:
                    await json_reply(reply, (201,))
    for _, inbound, outbound, _ in PATHS.values():
        for name in (inbound, outbound):
            status = await wait_status(base, name, "not up", lambda s: s["state"] == "up")
            endpoints[name] = status["endpoints"][0]
    return endpoints


def _counters(base: str, path: str) -> dict[str, dict[str, int]]:
    _, inbound, outbound, _ = PATHS[path]

    async def both() -> dict[str, dict[str, int]]:
        return {
            "in": (await bridge_status(base, inbound))["counters"],
            "out": (await bridge_status(base, outbound))["counters"],
        }

    return uvloop.run(both())


# ---------------------------------------------------------------- one run
def run_once(
    sender: Peer,
    receiver: Peer,
    run: str,
    count: int,
    gateway: Server,
    endpoints: dict[str, str],
) -> dict[str, Any]:
    """One run of ``run`` (raw3, raw1, a, b); its figures, or BenchError."""
    frames = 1 if run == "raw1" else 3
    if run.startswith("raw"):
        kind, to = "pull", "tcp://127.0.0.1:*"
    else:
        _, inbound, outbound, socket = PATHS[run]
        kind, to = ("sub" if socket == "pub" else "pull"), endpoints[outbound]
    receiver.command("pull", kind=kind, endpoint=to, count=count, frames=frames)
    bound = receiver.expect("ready", READY)
    before: dict[str, dict[str, int]] = {}
    if not run.startswith("raw"):
        if socket == "pub":  # the SUB's subscription has reached the bridge
            check = ("no subscription", lambda s: s.get("subscriptions", 0) >= 1)
        else:
            check = ("no peer", lambda s: s["peers"] >= 1)
        uvloop.run(wait_status(gateway.base, outbound, *check))
        before = _counters(gateway.base, run)
    target = bound if run.startswith("raw") else endpoints[inbound]
    sender.command("push", endpoint=target, count=count, frames=frames)
    sender.expect("ready", READY)
    ticks0, cpu0 = system_ticks(), cpu_seconds(gateway.pid)
    sender.go()
    sent = sender.expect("result", TIMEOUT)
    got = receiver.expect("result", TIMEOUT + STALL)
    busy = machine_busy(ticks0, system_ticks())
    cpu = cpu_seconds(gateway.pid) - cpu0
    if got["received"] < 2:
        raise BenchError(f"{LABELS[run]}: {got['received']} of {count} messages arrived")
    seconds = got["last"] - got["first"]
    out: dict[str, Any] = {
        "run": run,
        "count": count,
        "sent": sent["sent"],
        "received": got["received"],
        "lost": count - got["unique"],
        "repeats": got["repeats"],
        "bad": got["bad"],
        "unordered": got["unordered"],
        "seconds": seconds,
        "msg_per_s": got["received"] / seconds if seconds > 0 else 0.0,
        "end_to_end_s": got["last"] - sent["first"],  # the first send to the last arrival
        "send_s": sent["last"] - sent["first"],
        "machine_busy": busy,
    }
    if not run.startswith("raw"):
        # the pull bridge counts a batch once it is committed, which may come after its
        # messages have left through the other bridge: wait (bounded) for the count
        settle = time.monotonic() + STALL
        while (after := _counters(gateway.base, run))["in"]["published"] - before["in"][
            "published"
        ] < count and time.monotonic() < settle:
            time.sleep(POLL)
        delta = {
            side: {k: after[side][k] - before[side][k] for k in after[side]}
            for side in ("in", "out")
        }
        out["bridge"] = {
            "received": delta["in"]["received"],
            "published": delta["in"]["published"],
            "malformed": delta["in"]["malformed"],
            "refused": delta["in"]["refused"],
            "unroutable": delta["in"]["unroutable"],
            "throttled": delta["in"]["throttled"],
            "sent": delta["out"]["sent"],
            "dropped": delta["out"]["dropped"],
            "blocked": delta["out"]["blocked"],
        }
        out["gateway_cpu_s"] = cpu
        out["gateway_cpu_us_per_msg"] = cpu / count * 1e6
    return out


def _check(result: dict[str, Any]) -> list[str]:
    """What went wrong in a run: loss, repeats, bad frames, counters that disagree."""
    problems = [f"{result[key]} {key}" for key in ("lost", "repeats", "bad") if result[key]]
    bridge = result.get("bridge")
    if bridge:
        n = result["count"]
        for key in ("received", "published", "sent"):
            if bridge[key] != n:
                problems.append(f"bridge {key} {bridge[key]} (not {n})")
        for key in ("malformed", "refused", "unroutable", "dropped"):
            if bridge[key]:
                problems.append(f"bridge {key} {bridge[key]}")
    return problems


# ---------------------------------------------------------------- rounds
def _log_round(label: str, runs: dict[str, dict[str, Any]], ratios: dict[str, float]) -> None:
    parts = []
    for run in RUNS:
        r = runs[run]
        text = f"{run} {r['msg_per_s']:8,.0f}"
        if "gateway_cpu_us_per_msg" in r:
            text += f" ({r['gateway_cpu_us_per_msg']:.0f} CPU-us/msg)"
        parts.append(text)
    log(
        f"  {label}: " + " | ".join(parts) + " msg/s; "
        f"B/raw3 {ratios['b']:.3f} A/raw3 {ratios['a']:.3f}; busy "
        + "/".join(f"{runs[run]['machine_busy']:.0%}" for run in RUNS)
    )


def run(rounds: int, count: int, durable: bool = False) -> dict[str, Any]:
    """A warm-up of every path, then ``rounds`` rounds of the four runs.

    ``durable``: the outbound bridges' pipes store every message (not only the
    persistent ones; the benchmark's messages are not persistent)."""
    env = {
        "RESTMS_GUEST_SCOPES": GUEST_SCOPES,
        "RESTMS_RATE_LIMIT": "0",
        "RESTMS_MAX_PIPE_MESSAGES": str(max(100_000, 2 * count)),
    }
    out: dict[str, Any] = {
        "count": count,
        "target": TARGET,
        "payload_bytes": PAYLOAD_SIZE,
        "settings": {
            "gateway": "own process (main.py serve)",
            "store": "sqlite (default)",
            "max_pipe_messages": env["RESTMS_MAX_PIPE_MESSAGES"],
            "bridges": "window 256, sndhwm/rcvhwm 1000 (defaults), at_hwm block, "
            + f"durable {str(durable).lower()}",
            "peers": "two spawned processes, blocking pyzmq " + zmq.pyzmq_version(),
            "libzmq": zmq.zmq_version(),
        },
    }
    log("  " + ", ".join(f"{k}={v}" for k, v in out["settings"].items()))
    t0 = time.monotonic()
    sender, receiver = Peer("zmq-sender"), Peer("zmq-receiver")
    gateway = start("gateway", env)
    try:
        endpoints = uvloop.run(setup(gateway.base, durable))
        warm = max(1000, count // 10)
        for name in RUNS:  # warm-up: not recorded, but checked
            wrong = _check(run_once(sender, receiver, name, warm, gateway, endpoints))
            if wrong:
                raise BenchError(f"warm-up of {name}: {', '.join(wrong)}")
        play_rounds(
            out,
            rounds,
            RUNS,
            lambda _, name: run_once(sender, receiver, name, count, gateway, endpoints),
            lambda runs: {p: runs[p]["msg_per_s"] / runs["raw3"]["msg_per_s"] for p in "ab"},
            _check,
            _log_round,
        )
        if not gateway.alive():
            raise BenchError("the gateway died")
    finally:
        gateway.stop()
        sender.close()
        receiver.close()
    summarize(out)
    out["seconds"] = time.monotonic() - t0
    log(f"  {out['seconds']:.0f} s in all")
    return out


def summarize(out: dict[str, Any]) -> None:
    """Medians, per-round ratios and the verdicts, into ``out``; one log line each."""
    rounds = out["rounds"]
    for name in RUNS:
        out[f"{name}_median"] = median([r["runs"][name]["msg_per_s"] for r in rounds])
    log(
        f"  raw PUSH -> PULL: 3 frames {out['raw3_median']:,.0f} msg/s, 1 frame "
        f"{out['raw1_median']:,.0f} msg/s (medians; the target is against 3 frames)"
    )
    for path in "ba":
        runs = [r["runs"][path] for r in rounds]
        ratios = [r["ratios"][path] for r in rounds]
        out[f"{path}_ratios"] = ratios
        out[f"{path}_ratio"] = median(ratios)
        out[f"{path}_cpu_us_per_msg"] = median([x["gateway_cpu_us_per_msg"] for x in runs])
        out[f"{path}_unordered"] = sum(x["unordered"] for x in runs)
        out[f"{path}_blocked"] = sum(x["bridge"]["blocked"] for x in runs)
        out[f"{path}_problems"] = [r["problems"][path] for r in rounds if path in r["problems"]]
        out[f"{path}_pass"] = out[f"{path}_ratio"] >= TARGET and not out[f"{path}_problems"]
        log(
            f"  {LABELS[path]}: {out[f'{path}_median']:,.0f} msg/s; / raw 3 frames per round "
            f"{' '.join(f'{x:.3f}' for x in ratios)}; median {out[f'{path}_ratio']:.3f} "
            f"(target >= {TARGET}); lost, repeated or bad: "
            f"{out[f'{path}_problems'] or 'none'}; out of order {out[f'{path}_unordered']}; "
            f"waits at the HWM {out[f'{path}_blocked']} -> "
            f"{'PASS' if out[f'{path}_pass'] else 'FAIL'}"
        )
    out["raw_problems"] = [
        r["problems"][name] for r in rounds for name in ("raw1", "raw3") if name in r["problems"]
    ]
