"""The synchronous client against a real gateway: resources, publishing, reading,
acknowledgement, errors, both wire formats."""

from __future__ import annotations

import time

import pytest

from restms_client import (
    BadRequest,
    Client,
    Content,
    Delivery,
    Gap,
    GapError,
    Message,
    NotFound,
    Retry,
)
from tests.client.conftest import MakeProcess, unique
from tests.client.gateway import GatewayProcess


def first(client: Client, pipe: object, **options: object) -> Delivery[None]:
    for message in client.messages(pipe, **options):  # type: ignore[arg-type]
        return message
    raise AssertionError("the reader ended")


@pytest.mark.parametrize("wire", ["json", "xml"])
def test_resources_round_trip(gateway: GatewayProcess, wire: str) -> None:
    with Client(gateway.url, format=wire) as client:
        domain = client.domain()
        assert domain.href == gateway.url + "/restms/domain/default"
        assert "3/Defaults" in domain.profiles
        assert domain.feed("default").href == gateway.url + "/restms/feed/default"

        name = unique("orders")
        feed = client.create_feed(name, "topic", title="Orders")
        assert (feed.name, feed.type, feed.title, feed.created) == (name, "topic", "Orders", True)
        again = client.create_feed(name, "topic")  # idempotent
        assert (again.href, again.created) == (feed.href, False)
        assert client.feed(name) == feed

        pipe = client.create_pipe(title="work", lease=60, max_messages=100)
        assert pipe.settings["lease"] == "60"
        assert pipe.settings["max_messages"] == "100"
        assert pipe.asynclet == pipe.href + ".1"
        join = client.join(pipe, feed, "orders.#")
        assert (join.feed, join.address, join.created) == (feed.href, "orders.#", True)
        assert client.join(pipe, feed, "orders.#").created is False
        assert join in client.pipe(pipe).joins

        client.delete(join)
        assert join not in client.pipe(pipe).joins
        client.delete(pipe)
        with pytest.raises(NotFound) as gone:
            client.pipe(pipe)
        assert gone.value.status == 404
        assert gone.value.url == pipe.href


@pytest.mark.parametrize("wire", ["json", "xml"])
def test_publish_and_read_in_order(gateway: GatewayProcess, wire: str) -> None:
    with Client(gateway.url, format=wire) as client:
        feed = client.create_feed(unique("news"), "fanout")
        pipe = client.create_pipe(title="reader")
        client.join(pipe, feed)
        batch = [
            Message.of("plain text", address="a", headers={"lang": "en"}, priority=3),
            Message.of(b"\x00\xffbinary", address="b", correlation_id="c-1"),
            Message(address="c", contents=(Content(type="application/json", body=b"{}"),)),
            Message.of("control \x01 char", address="d", persistent=True, message_id="m-4"),
        ]
        published = client.publish(feed, batch)
        assert published.counts == (1, 1, 1, 1)
        assert published.duplicates == (False,) * 4
        assert published.message_ids[3] == "m-4"
        assert len(set(published.message_ids)) == 4

        got = []
        for message in client.messages(pipe):
            got.append(message)
            if len(got) == 4:
                break
        assert [m.position for m in got] == [1, 2, 3, 4]
        assert [m.message_id for m in got] == list(published.message_ids)
        assert got[0].text == "plain text"
        assert got[0].headers == {"lang": "en"}
        assert got[0].message.priority == 3
        assert got[0].message.feed == feed.href
        assert got[1].body == b"\x00\xffbinary"
        assert got[1].message.correlation_id == "c-1"
        assert got[2].message.contents[0].type == "application/json"
        assert got[3].text == "control \x01 char"
        assert got[3].message.persistent is True
        assert all(m.delivery_count == 0 for m in got)

        got[2].ack()  # cumulative: 1, 2 and 3 go
        assert [m.position for m in client.pipe(pipe).messages] == [4]


def test_auto_ack_after_the_handler(gateway: GatewayProcess) -> None:
    with Client(gateway.url) as client:
        pipe = client.create_pipe()
        client.publish(
            client.domain().feed("default"),
            [Message.of(str(i), address=pipe.name) for i in range(3)],
        )
        seen = []
        for message in client.messages(pipe, auto_ack=True):
            seen.append(message.text)
            # while the handler runs, its message is not yet acknowledged
            assert client.pipe(pipe).messages[0].position == message.position
            if len(seen) == 2:
                break  # leaving the loop acknowledges nothing more
        assert seen == ["0", "1"]
        assert [m.position for m in client.pipe(pipe).messages] == [2, 3]


def test_message_id_makes_a_repeat_a_duplicate(gateway: GatewayProcess) -> None:
    with Client(gateway.url) as client:
        feed = client.create_feed(unique("once"), "fanout")
        pipe = client.create_pipe()
        client.join(pipe, feed)
        message = Message.of("only once", message_id="order-42")
        assert client.publish(feed, message).duplicates == (False,)
        again = client.publish(feed, message)
        assert again.duplicates == (True,)
        assert again.message_ids == ("order-42",)
        assert len(client.pipe(pipe).messages) == 1


def test_redelivery_count_after_a_lease_runs_out(gateway: GatewayProcess) -> None:
    with Client(gateway.url) as client:
        pipe = client.create_pipe(lease=0.5)
        client.publish(client.domain().feed("default"), Message.of("job", address=pipe.name))
        reader = client.messages(pipe)
        first_time = next(reader)
        assert (first_time.position, first_time.delivery_count) == (1, 0)
        again = next(reader)  # not acknowledged: it comes back at a new position
        assert again.text == "job"
        assert again.delivery_count == 1
        assert again.position > 1
        again.ack()


def test_a_gap_is_raised_or_handed_to_on_gap(gateway: GatewayProcess) -> None:
    with Client(gateway.url) as client:
        pipe = client.create_pipe(max_messages=2, overflow="drop-oldest")
        default = client.domain().feed("default")
        client.publish(default, Message.of("1", address=pipe.name))
        reader = client.messages(pipe)
        assert next(reader).text == "1"
        # the pipe keeps two: 1 (read, not acknowledged), 2 and 3 are dropped for 4 and 5
        client.publish(default, [Message.of(str(i), address=pipe.name) for i in (2, 3, 4, 5)])
        with pytest.raises(GapError) as lost:
            next(reader)
        assert lost.value.gap == Gap(first=2, last=3, earliest=4)

        # A new reader starts with the oldest held (4) and tells of no gap before it;
        # with on_gap it reads on past one.
        gaps: list[Gap] = []
        reader = client.messages(pipe, on_gap=gaps.append)
        assert next(reader).text == "4"
        client.publish(default, [Message.of(str(i), address=pipe.name) for i in (6, 7, 8)])
        assert next(reader).text == "7"
        assert gaps == [Gap(first=5, last=6, earliest=7)]


def test_errors_keep_status_and_reason(gateway: GatewayProcess) -> None:
    with Client(gateway.url, retry=Retry(attempts=0)) as client:
        with pytest.raises(BadRequest) as bad:
            client.create_feed(unique("weird"), "no-such-type")
        assert bad.value.status == 400
        assert "no-such-type" in bad.value.reason
        assert "\n" not in bad.value.reason
        with pytest.raises(NotFound):
            client.feed("never-made")


def test_staged_content_is_linked_and_fetched(gateway: GatewayProcess) -> None:
    with Client(gateway.url) as client:
        feed = client.create_feed(unique("files"), "fanout")
        pipe = client.create_pipe()
        client.join(pipe, feed)
        staged = client.stage(feed, b"%PDF-1.7 bytes", "application/pdf")
        client.publish(feed, Message(contents=(staged,)))
        message = first(client, pipe)
        linked = message.message.contents[0]
        assert linked.body is None
        assert linked.href is not None
        fetched = client.content(linked)
        assert (fetched.type, fetched.body) == ("application/pdf", b"%PDF-1.7 bytes")


def test_a_wait_on_the_asynclet_ends_with_the_next_message(gateway: GatewayProcess) -> None:
    with Client(gateway.url) as client, Client(gateway.url) as publisher:
        pipe = client.create_pipe()
        reader = client.messages(pipe)
        import threading

        later = threading.Timer(
            0.3,
            lambda: publisher.publish(
                publisher.domain().feed("default"), Message.of("late", address=pipe.name)
            ),
        )
        started = time.monotonic()
        later.start()
        try:
            assert next(reader).text == "late"
        finally:
            later.join()
        assert time.monotonic() - started >= 0.25


@pytest.mark.parametrize("transport", ["sse", "websocket"])
def test_a_push_reader_is_told_of_a_gap_by_the_gateway(
    gateway: GatewayProcess, transport: str
) -> None:
    with Client(gateway.url) as client:
        pipe = client.create_pipe(max_messages=2, overflow="drop-oldest")
        default = client.domain().feed("default")
        # 1-3 are dropped unread to make room for 4 and 5
        client.publish(default, [Message.of(str(i), address=pipe.name) for i in range(1, 6)])
        gaps: list[Gap] = []
        got = []
        for message in client.messages(pipe, transport=transport, on_gap=gaps.append):
            got.append(message.text)
            if len(got) == 2:
                break
        assert gaps == [Gap(first=1, last=3, earliest=4)]
        assert got == ["4", "5"]
        with pytest.raises(GapError):  # without on_gap
            next(iter(client.messages(pipe, transport=transport)))


def test_websocket_reader_acknowledged_by_delete_moves_its_window(
    make_process: MakeProcess,
) -> None:
    # With a window of 2, the socket sends a third message only once the first two
    # are acknowledged: ack() (a DELETE of the message's href) must count for it.
    gateway = make_process({"RESTMS_WEBSOCKET_WINDOW": "2"})
    with Client(gateway.url) as client:
        pipe = client.create_pipe()
        default = client.domain().feed("default")
        client.publish(default, [Message.of(str(i), address=pipe.name) for i in range(6)])
        got = []
        for message in client.messages(pipe, transport="websocket"):
            got.append(message.text)
            message.ack()
            if len(got) == 6:
                break
        assert got == [str(i) for i in range(6)]


def test_a_bound_pipe_reads_as_for_message_in_pipe_messages(gateway: GatewayProcess) -> None:
    with Client(gateway.url) as client:
        feed = client.create_feed(unique("bound"), "fanout")
        pipe = client.bind(client.create_pipe(title="bound"))
        assert pipe.join(feed).feed == feed.href
        client.publish(feed, [Message.of("a"), Message.of("b")])
        got = []
        for message in pipe.messages(auto_ack=True):
            got.append(message.text)
            if len(got) == 2:
                break
        assert got == ["a", "b"]
        pipe.delete()
        with pytest.raises(NotFound):
            client.pipe(pipe.value)
