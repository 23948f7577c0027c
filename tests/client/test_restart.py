"""The library through real trouble: a gateway restarted under a consumer and under a
publisher, and a publish refused with 503 until a worker makes room. Nothing
acknowledged comes twice, nothing is lost, and no retried publish is routed twice."""

from __future__ import annotations

import logging
import threading
import time

import pytest

from restms_client import Client, Feed, Message, Pipe, Retry, ServiceUnavailable
from tests.client.conftest import MakeProcess
from tests.client.gateway import GatewayProcess

# Two restarts and a drain take seconds each, many more on a loaded machine.
pytestmark = pytest.mark.timeout(300)

# Patient enough to outlast a restart: a gateway process starts in 1 to 3 s on an idle
# machine, and much longer on a loaded one (up to 300 retries, about 2 minutes).
PATIENT = Retry(attempts=300, backoff=0.05, max_backoff=0.5)


def fanout(client: Client, name: str, **pipe: object) -> tuple[Feed, Pipe]:
    """A fanout feed and a pipe joined to it."""
    feed = client.create_feed(name, "fanout")
    made = client.create_pipe(title=name, **pipe)
    client.join(made, feed)
    return feed, made


def persistent_batches(early: int, late: int) -> tuple[list[str], list[str]]:
    return [f"early-{i}" for i in range(early)], [f"late-{i}" for i in range(late)]


def restart(gateway: GatewayProcess) -> None:
    gateway.stop()  # SIGTERM: waits end with 503, requests drain, then it exits
    gateway.start()


def test_a_consumer_survives_restarts_without_loss_or_repeats(
    make_process: MakeProcess, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = make_process()
    caplog.set_level(logging.INFO, logger="restms_client")
    with Client(gateway.url, retry=PATIENT) as client:
        feed, pipe = fanout(client, "jobs")
        early, late = persistent_batches(20, 10)
        client.publish(feed, [Message.of(i, message_id=i) for i in early], persistent=True)

        processed: list[str] = []
        restarts: list[threading.Thread] = []
        for message in client.messages(pipe):
            processed.append(message.text)
            if len(processed) in (5, len(early)):
                # down while this reader acknowledges (at 5) and while it waits on
                # the asynclet (at 20, before the late messages exist)
                restarts.append(threading.Thread(target=restart, args=(gateway,)))
                restarts[-1].start()
            message.ack()
            if len(processed) == len(early):
                restarts[-1].join()
                with Client(gateway.url, retry=PATIENT) as publisher:
                    publisher.publish(
                        feed, [Message.of(i, message_id=i) for i in late], persistent=True
                    )
            if len(processed) == len(early) + len(late):
                break
        for thread in restarts:
            thread.join()

        assert processed == early + late  # in order, each once
        assert gateway.starts == 3
        assert client.pipe(pipe).messages == ()  # every acknowledgement held
        assert any("retry" in r.getMessage() for r in caplog.records)


def test_a_publisher_retries_through_a_restart_without_duplicates(
    make_process: MakeProcess, caplog: pytest.LogCaptureFixture
) -> None:
    gateway = make_process()
    caplog.set_level(logging.INFO, logger="restms_client")
    ids = [f"m-{i}" for i in range(60)]
    with Client(gateway.url, retry=PATIENT) as client:
        feed, pipe = fanout(client, "audit", durable=True)
        published = threading.Event()
        failures: list[BaseException] = []

        def publish_all() -> None:
            try:
                with Client(gateway.url, retry=PATIENT) as publisher:
                    for n, i in enumerate(ids):
                        publisher.publish(feed, Message.of(i, message_id=i), persistent=True)
                        if n == 10:
                            published.set()
            except BaseException as exc:  # handed to the test's thread
                failures.append(exc)
                published.set()

        thread = threading.Thread(target=publish_all)
        thread.start()
        assert published.wait(30)
        restart(gateway)
        thread.join(120)
        assert not thread.is_alive()
        assert not failures

        held = client.pipe(pipe).messages
        assert [m.message_id for m in held] == ids  # each once, in order
        reasons = " ".join(r.getMessage() for r in caplog.records)
        assert "503" in reasons or "ConnectError" in reasons


def test_a_publish_refused_with_503_is_retried_when_there_is_room(
    make_process: MakeProcess, caplog: pytest.LogCaptureFixture
) -> None:
    # A service feed queues messages for workers that have not joined yet, up to
    # max_feed_queue: past it a publish is refused with 503, Retry-After: 1.
    gateway = make_process({"RESTMS_MAX_FEED_QUEUE": "2"})
    caplog.set_level(logging.INFO, logger="restms_client")
    with Client(gateway.url, retry=Retry(attempts=0)) as impatient:
        feed = impatient.create_feed("resize", "service")
        impatient.publish(feed, [Message.of("1", message_id="1"), Message.of("2", message_id="2")])
        with pytest.raises(ServiceUnavailable) as full:
            impatient.publish(feed, Message.of("3", message_id="3"))
        assert full.value.status == 503
        assert full.value.retry_after == 1
        assert "queue" in full.value.reason

    with Client(gateway.url) as client, Client(gateway.url) as worker:
        pipe = worker.create_pipe(title="worker")

        def join_later() -> None:
            time.sleep(0.5)
            worker.join(pipe, feed)  # the queued messages move into the worker's pipe

        joiner = threading.Thread(target=join_later)
        joiner.start()
        started = time.monotonic()
        reply = client.publish(feed, Message.of("3", message_id="3"))
        joiner.join()
        assert time.monotonic() - started >= 1.0  # Retry-After was honoured
        assert reply.counts == (1,)
        assert reply.duplicates == (False,)
        assert any("503" in r.getMessage() for r in caplog.records)

        got = []
        for message in worker.messages(pipe, auto_ack=True):
            got.append(message.text)
            if len(got) == 3:
                break
        assert got == ["1", "2", "3"]


@pytest.mark.parametrize("transport", ["sse", "websocket"])
def test_a_push_reader_resumes_after_a_restart(make_process: MakeProcess, transport: str) -> None:
    gateway = make_process()
    with Client(gateway.url, retry=PATIENT) as client:
        feed, pipe = fanout(client, "events")
        early, late = persistent_batches(10, 5)
        client.publish(feed, [Message.of(i) for i in early], persistent=True)
        processed: list[str] = []
        for message in client.messages(pipe, transport=transport):
            processed.append(message.text)
            message.ack()
            if len(processed) == 5:
                restart(gateway)  # the stream or socket ends; the reader opens it again
                with Client(gateway.url, retry=PATIENT) as publisher:
                    publisher.publish(feed, [Message.of(i) for i in late], persistent=True)
            if len(processed) == len(early) + len(late):
                break
        assert processed == early + late
        assert client.pipe(pipe).messages == ()
