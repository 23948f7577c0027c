"""A ZeroMQ peer in its own process, driven by a test over JSON lines.

    python -m tests.integration.zmq_peer ROLE --endpoint E [options]
    python tests/integration/zmq_peer.py ROLE --endpoint E [options]

The gateway's ZeroMQ bridge is tested against peers that share neither its process
nor its libzmq context, as real ones would. ``tests.integration.zmqpeers`` starts
and drives them from async tests; this file needs only the standard library and
pyzmq, so it also runs on its own.

Protocol: one JSON object per line, commands (``op``) on stdin, events (``ev``) on
stdout, frames as base64 strings.

    command    fields                              roles
    send       frames, count (1)                   pub, push
    send_many  messages: [[frames], ...]           pub, push
    request    frames, timeout (10 s)              req
    requests   messages: [[frames], ...], timeout  dealer-client
    stats                                          all
    stop                                           all (stdin EOF too)

    event      fields                              when
    ready      role, endpoints, pid                once, after bind/connect
    recv       frames                              sub, pull: each message
    sent       count, dropped                      pub, push: a send or send_many is through
    request    frames (+ routing)                  rep, dealer-worker: each request
    reply      frames                              req: the answer ...
    timeout                                        ... or none within the timeout
    replies    replies, missing                    dealer-client: all answers, or the timeout
    stats      received, sent, dropped, pending    on ``stats``
    error      error                               a command it cannot take; it goes on
    stopped    reason + the stats fields           last line, then exit 0

Workers (rep, dealer-worker) answer with the request's frames, the last one (the
body) prefixed with ``<id>:``. A dealer-worker keeps the routing frames (all up to
the first empty frame, which stays) and answers many requests at once; a rep answers
one at a time. ``--die-after N`` exits (0) on receiving the Nth request, unanswered.

Theory of operation: one thread polls the socket and stdin (``zmq.Poller``) and
never makes a blocking zmq call. Sends queue in an outbox that drains on POLLOUT, so
a PUSH or DEALER "blocks" (waits for a peer with room, drops nothing) while stdin is
still read; ``--noblock`` drops what does not fit at once instead. ``--delay`` and
request timeouts are timers; ``--slow`` withholds POLLIN for a while. No poll lasts
over ``TICK``, and the peer stops on stdin EOF or when it is orphaned, so it never
outlives its test by more than that. Sockets close with ``--linger`` (never
infinite) and the context terminates within it.
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import heapq
import itertools
import json
import os
import sys
import time
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

import zmq

SOCKET_TYPES = {
    "pub": zmq.PUB,
    "sub": zmq.SUB,
    "push": zmq.PUSH,
    "pull": zmq.PULL,
    "rep": zmq.REP,
    "dealer-worker": zmq.DEALER,
    "req": zmq.REQ,
    "dealer-client": zmq.DEALER,
}
SENDERS = ("pub", "push")
RECEIVERS = ("sub", "pull")
WORKERS = ("rep", "dealer-worker")
# Which roles an option means something to: any other role refuses it.
ONLY_FOR = {
    "subscribe": ("sub",),
    "noblock": SENDERS,
    "slow": RECEIVERS,
    "delay": WORKERS,
    "die_after": WORKERS,
    "id": WORKERS,
}
TICK = 0.5  # longest poll, in seconds: how soon an orphaned peer notices
BURST = 256  # most messages moved per direction per turn, so stdin is never starved
STDIN = 0


class Stop(Exception):
    """Leave the loop: close the socket, say ``stopped``, exit 0."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class StdoutGone(Exception):
    """The parent no longer reads our events."""


@dataclass(eq=False)
class Batch:
    """Messages queued by one command, reported on together."""

    total: int
    sent: int = 0
    dropped: int = 0
    report: bool = False  # emit ``sent`` once every message is sent or dropped


@dataclass(eq=False)
class Timer:
    due: float
    action: Callable[[], object]
    cancelled: bool = False


@dataclass(eq=False)
class Pending:
    """The outstanding request(s) of a req or dealer-client."""

    batch: Batch
    expected: int
    timer: Timer
    replies: list[list[bytes]] = field(default_factory=list)


def encode(frames: Sequence[bytes]) -> list[str]:
    return [base64.b64encode(f).decode("ascii") for f in frames]


def decode(frames: Any) -> list[bytes]:
    if not isinstance(frames, list) or not all(isinstance(f, str) for f in frames):
        raise ValueError("frames must be a list of base64 strings")
    return [base64.b64decode(f, validate=True) for f in frames]


def emit(ev: str, **fields: Any) -> None:
    try:
        sys.stdout.write(json.dumps({"ev": ev, **fields}, separators=(",", ":")) + "\n")
        sys.stdout.flush()
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's final flush stays quiet.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        raise StdoutGone from None


class Peer:
    """One socket and the loop that serves it."""

    def __init__(self, args: argparse.Namespace, sock: zmq.Socket[bytes]) -> None:
        self.args = args
        self.role: str = args.role
        self.sock = sock
        self.ident = args.id.encode() + b":"
        self.received = 0
        self.sent = 0
        self.dropped = 0
        self.outbox: deque[tuple[list[bytes], Batch]] = deque()
        self.timers: list[tuple[float, int, Timer]] = []
        self.order = itertools.count()
        self.paused_until = 0.0
        self.pending: Pending | None = None
        self.stdin = b""
        self.parent = os.getppid()

    def stats(self) -> dict[str, int]:
        return {
            "received": self.received,
            "sent": self.sent,
            "dropped": self.dropped,
            "pending": len(self.outbox),
        }

    # -- the loop

    def run(self) -> str:
        """Serve until told to stop; return why it stopped."""
        poller = zmq.Poller()
        poller.register(STDIN, zmq.POLLIN)
        try:
            while True:
                self.fire_timers()
                self.flush()
                poller.register(self.sock, self.wants())  # flags 0 unregisters
                ready = dict(poller.poll(self.poll_ms()))
                if ready.get(STDIN):
                    self.read_stdin()
                if ready.get(self.sock, 0) & zmq.POLLIN:
                    self.receive()
                if os.getppid() != self.parent:
                    raise Stop("orphaned")
        except Stop as stop:
            return stop.reason
        except StdoutGone:
            return "stdout closed"

    def wants(self) -> int:
        flags = zmq.POLLOUT if self.outbox else 0
        if self.role in SENDERS:
            return flags
        if self.role == "req" and (self.pending is None or self.outbox):
            return flags  # a REQ receives only once its request is out
        if self.role == "rep" and (self.outbox or self.timers):
            return flags  # a REP answers before it takes the next request
        if time.monotonic() < self.paused_until:
            return flags
        return flags | zmq.POLLIN

    def poll_ms(self) -> int:
        now = time.monotonic()
        wait = TICK
        if self.timers:
            wait = min(wait, self.timers[0][0] - now)
        if self.paused_until > now:
            wait = min(wait, self.paused_until - now)
        return max(0, int(wait * 1000) + 1)

    def later(self, delay: float, action: Callable[[], object]) -> Timer:
        timer = Timer(time.monotonic() + delay, action)
        heapq.heappush(self.timers, (timer.due, next(self.order), timer))
        return timer

    def fire_timers(self) -> None:
        now = time.monotonic()
        while self.timers and self.timers[0][0] <= now:
            _, _, timer = heapq.heappop(self.timers)
            if not timer.cancelled:
                timer.action()

    # -- sending

    def queue(self, messages: list[list[bytes]], *, report: bool) -> Batch:
        batch = Batch(total=len(messages), report=report)
        self.outbox.extend((m, batch) for m in messages)
        self.settled(batch)  # an empty batch is through at once
        return batch

    def flush(self) -> None:
        for _ in range(BURST):
            if not self.outbox:
                return
            frames, batch = self.outbox[0]
            try:
                self.sock.send_multipart(frames, zmq.NOBLOCK)
            except zmq.Again:
                if not self.args.noblock:
                    return  # wait for POLLOUT: no peer yet, or its queue is full
                batch.dropped += 1
                self.dropped += 1
            else:
                batch.sent += 1
                self.sent += 1
            self.outbox.popleft()
            self.settled(batch)

    def settled(self, batch: Batch) -> None:
        if batch.report and batch.sent + batch.dropped == batch.total:
            emit("sent", count=batch.sent, dropped=batch.dropped)

    def purge(self, batch: Batch) -> None:
        self.outbox = deque(item for item in self.outbox if item[1] is not batch)

    # -- receiving

    def receive(self) -> None:
        for _ in range(BURST):
            try:
                frames = self.sock.recv_multipart(zmq.NOBLOCK)
            except zmq.Again:
                return
            self.received += 1
            if self.role in RECEIVERS:
                emit("recv", frames=encode(frames))
                if self.args.slow:
                    self.paused_until = time.monotonic() + self.args.slow
                    return
            elif self.role in WORKERS:
                self.work(frames)
            else:
                self.answered(frames)
            if self.role in ("rep", "req"):
                return  # one message per turn: a second recv would be out of turn (EFSM)

    def work(self, frames: list[bytes]) -> None:
        if self.role == "dealer-worker" and b"" in frames:
            cut = frames.index(b"") + 1
            routing, payload = frames[:cut], frames[cut:]
            emit("request", frames=encode(payload), routing=encode(routing[:-1]))
        else:
            routing, payload = [], frames
            emit("request", frames=encode(payload))
        if self.args.die_after and self.received >= self.args.die_after:
            raise Stop("die-after")
        if payload:
            payload = [*payload[:-1], self.ident + payload[-1]]
        reply = [*routing, *payload]
        if self.args.delay:
            self.later(self.args.delay, lambda: self.queue([reply], report=False))
        else:
            self.queue([reply], report=False)

    def answered(self, frames: list[bytes]) -> None:
        pending = self.pending
        if pending is None:
            return  # an answer after its request timed out: counted, not reported
        if self.role == "req":
            pending.timer.cancelled = True
            self.pending = None
            emit("reply", frames=encode(frames))
            return
        if frames[:1] == [b""]:
            frames = frames[1:]
        pending.replies.append(frames)
        if len(pending.replies) == pending.expected:
            pending.timer.cancelled = True
            self.pending = None
            emit("replies", replies=[encode(r) for r in pending.replies], missing=0)

    def timed_out(self) -> None:
        # The timer is cancelled when the answers are in: this is the request it was for.
        pending, self.pending = self.pending, None
        if pending is None:
            return
        self.purge(pending.batch)
        if self.role == "req":
            emit("timeout")
        else:
            missing = pending.expected - len(pending.replies)
            emit("replies", replies=[encode(r) for r in pending.replies], missing=missing)

    # -- commands

    def read_stdin(self) -> None:
        chunk = os.read(STDIN, 65536)
        if not chunk:
            raise Stop("eof")
        self.stdin += chunk
        *lines, self.stdin = self.stdin.split(b"\n")
        for line in lines:
            if line.strip():
                self.command(line)

    def command(self, line: bytes) -> None:
        try:
            op = json.loads(line)
            if not isinstance(op, dict):
                raise ValueError("a command is a JSON object")
            name = op.get("op")
            if name == "stop":
                raise Stop("stop")
            if name == "stats":
                emit("stats", **self.stats())
            elif name == "send" and self.role in SENDERS:
                count = int(op.get("count", 1))
                if count < 0:
                    raise ValueError("count must not be negative")
                self.queue([decode(op["frames"])] * count, report=True)
            elif name == "send_many" and self.role in SENDERS:
                self.queue([decode(m) for m in op["messages"]], report=True)
            elif name == "request" and self.role == "req":
                self.ask([decode(op["frames"])], float(op.get("timeout", 10.0)))
            elif name == "requests" and self.role == "dealer-client":
                messages = [[b"", *decode(m)] for m in op["messages"]]
                self.ask(messages, float(op.get("timeout", 10.0)))
            else:
                raise ValueError(f"a {self.role} peer does not take {name!r}")
        except (ValueError, KeyError, TypeError) as exc:
            emit(
                "error", error=f"{type(exc).__name__}: {exc}", command=line.decode(errors="replace")
            )

    def ask(self, messages: list[list[bytes]], timeout: float) -> None:
        if self.pending is not None:
            raise ValueError("a request is still outstanding")
        if not messages:
            emit("replies", replies=[], missing=0)
            return
        batch = self.queue(messages, report=False)
        timer = self.later(timeout, self.timed_out)
        self.pending = Pending(batch=batch, expected=len(messages), timer=timer)


# -- start-up


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="zmq_peer", description="A ZeroMQ peer driven over JSON lines (see the source)."
    )
    parser.add_argument("role", choices=sorted(SOCKET_TYPES))
    parser.add_argument("--endpoint", action="append", required=True, help="repeatable")
    parser.add_argument("--bind", action="store_true", help="bind instead of connect")
    parser.add_argument("--sndhwm", type=int)
    parser.add_argument("--rcvhwm", type=int)
    parser.add_argument("--linger", type=int, default=1000, help="ms, at close (default 1000)")
    parser.add_argument("--subscribe", action="append", help="sub: a prefix (repeatable)")
    parser.add_argument("--noblock", action="store_true", help="drop what cannot go at once")
    parser.add_argument("--slow", type=float, default=0.0, help="seconds after each message")
    parser.add_argument("--delay", type=float, default=0.0, help="seconds before each reply")
    parser.add_argument("--die-after", type=int, default=0, help="exit on the Nth request")
    parser.add_argument("--id", default=None, help="prefix of the replies (default: pid)")
    parser.add_argument("--curve-secret", help="Z85")
    parser.add_argument("--curve-public", help="Z85")
    parser.add_argument("--curve-server", action="store_true")
    parser.add_argument("--curve-serverkey", help="Z85: be a CURVE client of this server")
    args = parser.parse_args(argv)
    for option, roles in ONLY_FOR.items():
        if getattr(args, option) and args.role not in roles:
            parser.error(f"--{option.replace('_', '-')} is for {', '.join(roles)} only")
    if args.linger < 0:
        parser.error("--linger must be 0 or more (an infinite linger could hang the exit)")
    if args.curve_server and args.curve_serverkey:
        parser.error("--curve-server and --curve-serverkey exclude each other")
    curve = args.curve_server or args.curve_serverkey
    if curve and not (args.curve_secret and args.curve_public):
        parser.error("CURVE needs --curve-secret and --curve-public")
    if (args.curve_secret or args.curve_public) and not curve:
        parser.error("CURVE keys need --curve-server or --curve-serverkey")
    if args.id is None:
        args.id = str(os.getpid())
    return args


def open_socket(
    ctx: zmq.Context[zmq.Socket[bytes]], args: argparse.Namespace
) -> tuple[zmq.Socket[bytes], list[str]]:
    """Make, configure and bind or connect the socket; return it and its actual endpoints."""
    sock = ctx.socket(SOCKET_TYPES[args.role])
    sock.linger = args.linger
    if args.sndhwm is not None:
        sock.sndhwm = args.sndhwm
    if args.rcvhwm is not None:
        sock.rcvhwm = args.rcvhwm
    if args.curve_secret:
        sock.curve_secretkey = args.curve_secret.encode()
        sock.curve_publickey = args.curve_public.encode()
        if args.curve_server:
            sock.curve_server = True
        else:
            sock.curve_serverkey = args.curve_serverkey.encode()
    if args.role == "sub":
        for prefix in args.subscribe or [""]:
            sock.setsockopt(zmq.SUBSCRIBE, prefix.encode())
    if args.role == "req":
        # After a timeout the next request may go at once; stale replies are dropped.
        sock.setsockopt(zmq.REQ_RELAXED, 1)
        sock.setsockopt(zmq.REQ_CORRELATE, 1)
    endpoints = []
    for endpoint in args.endpoint:
        if args.bind:
            sock.bind(endpoint)
            endpoints.append(sock.getsockopt_string(zmq.LAST_ENDPOINT))
        else:
            sock.connect(endpoint)
            endpoints.append(endpoint)
    return sock, endpoints


def main(argv: Sequence[str] | None = None) -> int:
    args = parse(argv)
    ctx: zmq.Context[zmq.Socket[bytes]] = zmq.Context()
    try:
        sock, endpoints = open_socket(ctx, args)
    except zmq.ZMQError as exc:
        print(f"zmq_peer {args.role}: {exc}", file=sys.stderr)
        ctx.destroy(linger=0)
        return 2
    peer = Peer(args, sock)
    reason = "stdout closed"
    with contextlib.suppress(StdoutGone):
        emit("ready", role=args.role, endpoints=endpoints, pid=os.getpid())
        reason = peer.run()
    sock.close(linger=0 if reason == "die-after" else args.linger)
    ctx.term()
    with contextlib.suppress(StdoutGone):
        emit("stopped", reason=reason, **peer.stats())
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:
        sys.exit(130)
