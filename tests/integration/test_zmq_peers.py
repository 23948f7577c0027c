"""The ZeroMQ test peers against each other, before they judge the gateway's bridge.

Each peer is a real process (``tests.integration.zmq_peer``) on 127.0.0.1; the
binding side takes a free port (``tcp://127.0.0.1:*``) and reports it.
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import pytest
import zmq
from blockbuster import BlockBuster

from tests.integration.zmqpeers import Peer, Peers, b64, settle, unb64

pytestmark = [pytest.mark.integration, pytest.mark.timeout(60)]

ANY_PORT = "tcp://127.0.0.1:*"


@pytest.fixture
async def peers(blockbuster: BlockBuster) -> AsyncIterator[Peers]:
    async with Peers() as group:
        yield group


async def bound(peers: Peers, role: str, *args: str) -> Peer:
    return await peers.start(role, "--bind", "--endpoint", ANY_PORT, *args)


async def connected(peers: Peers, role: str, to: Peer, *args: str) -> Peer:
    return await peers.start(role, "--endpoint", to.endpoint, *args)


def answer(worker: str, request: list[bytes]) -> list[bytes]:
    """What a worker with ``--id worker`` replies to ``request``."""
    return [*request[:-1], worker.encode() + b":" + request[-1]]


async def test_push_pull_delivers_every_message_in_order(peers: Peers) -> None:
    pull = await bound(peers, "pull")
    push = await connected(peers, "push", pull)
    messages = [[b"n", b"%d" % i] for i in range(1000)]
    await push.send({"op": "send_many", "messages": [b64(m) for m in messages]})
    assert await push.event("sent") == {"ev": "sent", "count": 1000, "dropped": 0}
    assert await pull.received(1000) == messages
    assert (await pull.stop())["received"] == 1000
    assert (await push.stop())["sent"] == 1000


async def test_push_waits_for_a_peer_unless_noblock(peers: Peers) -> None:
    waiting = await bound(peers, "push")
    dropping = await bound(peers, "push", "--noblock")
    await waiting.send({"op": "send", "frames": b64([b"held"]), "count": 3})
    await dropping.send({"op": "send", "frames": b64([b"lost"]), "count": 3})
    assert await dropping.event("sent") == {"ev": "sent", "count": 0, "dropped": 3}
    # Held, not dropped, and the peer still answers while its send waits.
    assert await waiting.stats() == {
        "ev": "stats", "received": 0, "sent": 0, "dropped": 0, "pending": 3
    }  # fmt: skip
    pull = await connected(peers, "pull", waiting)
    assert await pull.received(3) == [[b"held"]] * 3
    assert await waiting.event("sent") == {"ev": "sent", "count": 3, "dropped": 0}


async def test_slow_pull_pushes_back_on_a_blocking_push(peers: Peers) -> None:
    pull = await bound(peers, "pull", "--slow", "0.002", "--rcvhwm", "4")
    push = await connected(peers, "push", pull, "--sndhwm", "4")
    messages = [[b"%d" % i] for i in range(200)]
    await push.send({"op": "send_many", "messages": [b64(m) for m in messages]})
    assert await pull.received(200) == messages
    assert (await push.event("sent"))["dropped"] == 0


async def test_sub_gets_only_its_prefixes(peers: Peers) -> None:
    pub = await bound(peers, "pub")
    a = await connected(peers, "sub", pub, "--subscribe", "a.")
    bc = await connected(peers, "sub", pub, "--subscribe", "b.", "--subscribe", "c.")
    everything = await connected(peers, "sub", pub)
    await settle(pub, [a, bc, everything], [b"a.probe"], [b"b.probe"])
    sent = [[f"{topic}.{i}".encode(), b"body %d" % i] for i in range(20) for topic in "abcd"]
    ends = [[b"a.end"], [b"b.end"], [b"d.end"]]  # sent last: nothing can come after them
    await pub.send({"op": "send_many", "messages": [b64(m) for m in sent + ends]})
    await pub.event("sent")

    def starting(*prefixes: bytes) -> list[list[bytes]]:
        return [m for m in sent + ends if m[0].startswith(prefixes)]

    assert await a.received(21) == starting(b"a.")
    assert await bc.received(41) == starting(b"b.", b"c.")
    assert await everything.received(83) == sent + ends


async def test_req_rep_round_trips(peers: Peers) -> None:
    rep = await bound(peers, "rep", "--id", "w")
    req = await connected(peers, "req", rep)
    for i in range(20):
        request = [b"head %d" % i, b"body %d" % i]
        await req.send({"op": "request", "frames": b64(request), "timeout": 5})
        assert unb64((await req.event("reply"))["frames"]) == answer("w", request)
        assert unb64((await rep.event("request"))["frames"]) == request


async def test_dealer_client_gets_100_concurrent_answers_from_reps(peers: Peers) -> None:
    client = await bound(peers, "dealer-client")
    workers = ("w1", "w2", "w3")
    for name in workers:
        await connected(peers, "rep", client, "--id", name, "--delay", "0.005")
    requests = [[b"h", b"request %d" % i] for i in range(100)]
    await client.send({"op": "requests", "messages": [b64(r) for r in requests], "timeout": 10})
    replies = await client.event("replies", timeout=15)
    assert replies["missing"] == 0
    bodies = []
    for reply in map(unb64, replies["replies"]):
        who, _, body = reply[-1].partition(b":")
        assert who.decode() in workers
        assert reply == answer(who.decode(), [b"h", body])
        bodies.append(body)
    assert sorted(bodies) == sorted(r[-1] for r in requests)


async def test_dealer_worker_answers_concurrently(peers: Peers) -> None:
    worker = await bound(peers, "dealer-worker", "--id", "dw", "--delay", "0.2")
    client = await connected(peers, "dealer-client", worker)
    requests = [[b"request %d" % i] for i in range(100)]
    loop = asyncio.get_running_loop()
    began = loop.time()
    await client.send({"op": "requests", "messages": [b64(r) for r in requests], "timeout": 5})
    replies = await client.event("replies")
    # One at a time would take 20 s; concurrently it is about one delay.
    assert loop.time() - began < 4
    assert replies["missing"] == 0
    assert sorted(map(unb64, replies["replies"])) == sorted(answer("dw", r) for r in requests)
    assert unb64((await worker.event("request"))["routing"]) == []


async def test_dealer_client_reports_what_is_missing(peers: Peers) -> None:
    rep = await bound(peers, "rep", "--die-after", "3", "--id", "r")
    client = await connected(peers, "dealer-client", rep)
    requests = [[b"%d" % i] for i in range(5)]
    await client.send({"op": "requests", "messages": [b64(r) for r in requests], "timeout": 1})
    replies = await client.event("replies")
    assert replies["missing"] == 3
    assert list(map(unb64, replies["replies"])) == [answer("r", r) for r in requests[:2]]


async def test_rep_dies_after_n_requests(peers: Peers) -> None:
    rep = await bound(peers, "rep", "--die-after", "3", "--id", "r")
    req = await connected(peers, "req", rep)
    for i in range(2):
        await req.send({"op": "request", "frames": b64([b"%d" % i]), "timeout": 5})
        assert unb64((await req.event("reply"))["frames"]) == [b"r:%d" % i]
    await req.send({"op": "request", "frames": b64([b"last"]), "timeout": 0.5})
    assert await req.event("timeout") == {"ev": "timeout"}
    assert (await rep.event("stopped"))["reason"] == "die-after"
    assert await rep.exited() == 0
    assert [unb64(e["frames"]) for e in [await rep.event("request") for _ in range(3)]] == [
        [b"0"], [b"1"], [b"last"]
    ]  # fmt: skip


async def test_curve_needs_the_right_server_key(peers: Peers) -> None:
    assert zmq.has("curve"), "libzmq without CURVE"
    server_public, server_secret = zmq.curve_keypair()
    wrong_public, _ = zmq.curve_keypair()

    def curve(secret: bytes, public: bytes, serverkey: bytes | None = None) -> tuple[str, ...]:
        # "--option=value": a Z85 key may start with "-", which would read as an option
        role = f"--curve-serverkey={serverkey.decode()}" if serverkey else "--curve-server"
        return (f"--curve-secret={secret.decode()}", f"--curve-public={public.decode()}", role)

    pub = await bound(peers, "pub", *curve(server_secret, server_public))
    client_public, client_secret = zmq.curve_keypair()
    good = await connected(peers, "sub", pub, *curve(client_secret, client_public, server_public))
    bad = await connected(peers, "sub", pub, *curve(client_secret, client_public, wrong_public))
    await settle(pub, [good], [b"probe"])
    messages = [[b"secret %d" % i] for i in range(50)]
    await pub.send({"op": "send_many", "messages": [b64(m) for m in messages]})
    assert await good.received(50) == messages
    await asyncio.sleep(0.5)  # the bad client had as long as the good one, and more
    assert (await bad.stats())["received"] == 0

    pull = await bound(peers, "pull", *curve(server_secret, server_public))
    push = await connected(peers, "push", pull, *curve(client_secret, client_public, server_public))
    await push.send({"op": "send", "frames": b64([b"over curve"]), "count": 10})
    assert await pull.received(10) == [[b"over curve"]] * 10


async def test_a_peer_leaves_on_stdin_eof_and_a_killed_one_fails_fast(peers: Peers) -> None:
    pull = await bound(peers, "pull")
    assert pull.proc.stdin is not None
    pull.proc.stdin.close()
    assert await pull.exited() == 0

    victim = await bound(peers, "pull")
    await victim.kill()
    with pytest.raises(AssertionError, match="exited before a 'recv' event"):
        await victim.received(1, timeout=5)
