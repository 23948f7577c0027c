"""The real RabbitMQ on 127.0.0.1:5672, driven from tests.

``Broker`` wraps one pika ``BlockingConnection`` (AMQP 0-9-1, guest/guest) to
declare, fill, inspect and empty queues, and ``rabbitmqctl`` to stop and start
the broker's app. Its methods block: from an async test call them through
``asyncio.to_thread`` (the blockbuster fixture fails blocking calls on the loop).
A lock serialises them, so concurrent threads are safe.

Every wait is bounded. The connection is reopened when it died (``stop_app``
kills it, and so does a broker that went away between tests): an operation that
meets a dead connection is retried once on a fresh one.

``amqp1_handshake`` proves the AMQP 1.0 plugin answers; ``DurableTerminus`` is
the link option AMQP 1.0 links to durable queues need on RabbitMQ 3.10, whose
plugin ends the session with ``amqp:precondition-failed`` when a terminus'
durability differs from the queue's.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any, TypeVar

import pika
import pika.exceptions
from pika.adapters.blocking_connection import BlockingChannel
from proton import Endpoint, Link, Terminus
from proton.handlers import MessagingHandler
from proton.reactor import Container, LinkOption

HOST = "127.0.0.1"
PORT = 5672
USER = "guest"
PASSWORD = "guest"  # RabbitMQ's default account, loopback logins only
AMQP1_URL = f"amqp://{HOST}:{PORT}"

# The Debian wrappers in /usr/sbin run rabbitmqctl as the rabbitmq user (with its
# Erlang cookie); /usr/lib/rabbitmq/bin is a last resort.
_CTL_PATH = os.pathsep.join(
    [os.environ.get("PATH", ""), "/usr/sbin", "/sbin", "/usr/lib/rabbitmq/bin"]
)

T = TypeVar("T")
Got = tuple[Any, pika.BasicProperties, bytes]  # (Basic.GetOk, properties, body)


class BrokerUnavailable(Exception):
    """RabbitMQ, its AMQP 1.0 plugin or rabbitmqctl cannot be had."""


class DurableTerminus(LinkOption):
    """Make the link's remote terminus durable (``Terminus.DELIVERIES``).

    Needed for links to and from durable queues on RabbitMQ 3.10: a sender's
    target, a receiver's source.
    """

    def apply(self, link: Link) -> None:
        terminus = link.target if link.is_sender else link.source
        terminus.durability = Terminus.DELIVERIES


def amqp1_handshake(url: str = AMQP1_URL, *, timeout: float = 10.0) -> dict[str, Any]:
    """Open and close one AMQP 1.0 connection as guest; return the broker's properties.

    Raises ``BrokerUnavailable`` when it does not open within ``timeout`` seconds.
    Blocks: not for the event loop.
    """
    handler = _Handshake(url, timeout)
    Container(handler).run()
    if handler.error is not None:
        raise BrokerUnavailable(f"AMQP 1.0 connection to {url} as {USER}: {handler.error}")
    return handler.properties


class _Handshake(MessagingHandler):
    def __init__(self, url: str, timeout: float) -> None:
        super().__init__()
        self.url = url
        self.timeout = timeout
        self.properties: dict[str, Any] = {}
        self.error: str | None = "closed before it opened"

    def on_start(self, event: Any) -> None:
        self.timer = event.container.schedule(self.timeout, self)
        event.container.connect(
            self.url, user=USER, password=PASSWORD, allowed_mechs="PLAIN", reconnect=False
        )

    def on_connection_opened(self, event: Any) -> None:
        self.error = None
        self.properties = {str(k): v for k, v in (event.connection.remote_properties or {}).items()}
        event.connection.close()

    def on_connection_closed(self, event: Any) -> None:
        self._finish(event)

    def on_connection_error(self, event: Any) -> None:
        self.error = _condition(event.connection)
        self._finish(event)

    def on_transport_error(self, event: Any) -> None:
        self.error = _condition(event.transport)
        self._finish(event)

    def on_timer_task(self, event: Any) -> None:
        self.error = f"no answer within {self.timeout} s"
        event.container.stop()

    def _finish(self, event: Any) -> None:
        self.timer.cancel()
        # Without stop() the reactor idles on until its next 3 s tick.
        event.container.stop()


def _condition(endpoint: Endpoint | Any) -> str:
    cond = getattr(endpoint, "remote_condition", None) or getattr(endpoint, "condition", None)
    return f"{cond.name}: {cond.description}" if cond is not None else "closed with no condition"


class Broker:
    """Test-side access to the local RabbitMQ over AMQP 0-9-1 (pika) and rabbitmqctl."""

    def __init__(self, host: str = HOST, port: int = PORT) -> None:
        self.host = host
        self.port = port
        self.params = pika.ConnectionParameters(
            host=host,
            port=port,
            credentials=pika.PlainCredentials(USER, PASSWORD),
            connection_attempts=1,
            socket_timeout=5,
            stack_timeout=10,
            blocked_connection_timeout=10,
            # Tests leave this connection idle between calls: no heartbeats to miss.
            heartbeat=0,
        )
        self.app_stopped = False
        self._tracked: list[str] = []
        self._lock = threading.Lock()
        self._conn: pika.BlockingConnection | None = None
        self._chan: BlockingChannel | None = None

    # -- queues and messages

    def declare_queue(
        self, name: str, durable: bool = True, bind: tuple[str, str] | None = None
    ) -> None:
        """Declare queue ``name``; bind it to ``(exchange, routing_key)`` if given."""

        def run(ch: BlockingChannel) -> None:
            ch.queue_declare(queue=name, durable=durable)
            if bind is not None:
                exchange, routing_key = bind
                ch.queue_bind(queue=name, exchange=exchange, routing_key=routing_key)

        self._run(run)

    def declare_exchange(self, name: str, kind: str = "direct") -> None:
        self._run(lambda ch: ch.exchange_declare(exchange=name, exchange_type=kind))

    def delete_exchange(self, name: str) -> None:
        self._run(lambda ch: ch.exchange_delete(exchange=name))

    def delete_queue(self, name: str) -> None:
        """Delete queue ``name`` (absent already is fine)."""
        self._run(lambda ch: ch.queue_delete(queue=name))

    def purge(self, name: str) -> None:
        self._run(lambda ch: ch.queue_purge(queue=name))

    def depth(self, name: str) -> int:
        """Messages ready in queue ``name``; ``ChannelClosedByBroker`` (404) if absent."""
        frame = self._run(lambda ch: ch.queue_declare(queue=name, passive=True))
        return int(frame.method.message_count)

    def publish(
        self,
        exchange: str,
        routing_key: str,
        body: bytes,
        properties: pika.BasicProperties | None = None,
    ) -> None:
        """Publish and wait for the broker's confirm (so ``depth`` sees it at once)."""
        self._run(
            lambda ch: ch.basic_publish(
                exchange=exchange, routing_key=routing_key, body=body, properties=properties
            )
        )

    def get(self, name: str, timeout: float = 5.0) -> Got | None:
        """Take one message from ``name`` (auto-ack), polling up to ``timeout`` seconds."""
        got = self.get_all(name, 1, timeout)
        return got[0] if got else None

    def get_all(self, name: str, count: int, timeout: float = 5.0) -> list[Got]:
        """Take up to ``count`` messages from ``name`` within ``timeout`` seconds."""
        deadline = time.monotonic() + timeout

        def run(ch: BlockingChannel) -> list[Got]:
            got: list[Got] = []
            while len(got) < count:
                method, properties, body = ch.basic_get(queue=name, auto_ack=True)
                if method is not None:
                    got.append((method, properties, body))
                    continue
                if time.monotonic() >= deadline:
                    break
                time.sleep(0.05)
            return got

        return self._run(run)

    # -- cleanup

    def track(self, name: str) -> str:
        """Register queue ``name`` for deletion after the current test; return it."""
        with self._lock:
            if name not in self._tracked:
                self._tracked.append(name)
        return name

    def cleanup(self) -> None:
        """Start the app if a test left it stopped, then delete the tracked queues."""
        self.ensure_app_running()
        with self._lock:
            names, self._tracked = self._tracked, []
        failed: list[str] = []
        for name in names:
            try:
                self.delete_queue(name)
            except pika.exceptions.AMQPError as exc:
                failed.append(f"{name}: {exc!r}")
        if failed:
            raise RuntimeError("could not delete test queues: " + "; ".join(failed))

    # -- the broker's app

    def stop_app(self, timeout: float = 60.0) -> None:
        """``rabbitmqctl stop_app``: the node stays up, AMQP connections are dropped."""
        self.app_stopped = True
        self._ctl("stop_app", timeout=timeout)
        with self._lock:
            self._drop()

    def start_app(self, timeout: float = 60.0) -> None:
        """``rabbitmqctl start_app``, then wait until AMQP 0-9-1 logins work again."""
        deadline = time.monotonic() + timeout
        self._ctl("start_app", timeout=timeout)
        self.wait_ready(max(deadline - time.monotonic(), 1.0))
        self.app_stopped = False

    def ensure_app_running(self) -> None:
        """Restart the app if ``stop_app`` was called and ``start_app`` was not."""
        if self.app_stopped:
            self.start_app()

    def wait_ready(self, timeout: float = 60.0) -> None:
        """Wait until the broker accepts an AMQP 0-9-1 login, at most ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            try:
                with self._lock:
                    self._channel()
                return
            except pika.exceptions.AMQPConnectionError as exc:
                if time.monotonic() >= deadline:
                    raise BrokerUnavailable(
                        f"RabbitMQ on {self.host}:{self.port} refused AMQP logins "
                        f"for {timeout:.0f} s: {exc!r}"
                    ) from exc
                time.sleep(0.25)

    def close(self) -> None:
        with self._lock:
            # A broker restarted meanwhile (a test's stop_app, or another run's) has
            # dropped the connection already: there is nothing left to close.
            if self._conn is not None and self._conn.is_open:
                with contextlib.suppress(pika.exceptions.StreamLostError):
                    self._conn.close()
            self._conn = self._chan = None

    # -- internals

    def _ctl(self, command: str, *, timeout: float) -> None:
        ctl = shutil.which("rabbitmqctl", path=_CTL_PATH)
        if ctl is None:
            raise BrokerUnavailable("rabbitmqctl not found on PATH, /usr/sbin or /usr/lib")
        try:
            subprocess.run(
                [ctl, "-q", command], check=True, capture_output=True, text=True, timeout=timeout
            )
        except subprocess.CalledProcessError as exc:
            raise BrokerUnavailable(
                f"rabbitmqctl {command} exited {exc.returncode}: {exc.stderr.strip()}"
            ) from exc
        except subprocess.TimeoutExpired as exc:
            raise BrokerUnavailable(f"rabbitmqctl {command} took over {timeout} s") from exc

    def _run(self, op: Callable[[BlockingChannel], T]) -> T:
        with self._lock:
            try:
                return op(self._channel())
            except pika.exceptions.AMQPConnectionError:
                # The connection died since the last call: once more on a new one.
                self._drop()
                return op(self._channel())

    def _channel(self) -> BlockingChannel:
        if self._conn is None or not self._conn.is_open:
            self._drop()
            self._conn = pika.BlockingConnection(self.params)
        if self._chan is None or not self._chan.is_open:
            # A channel error (404 on a passive declare, say) closes only the channel.
            self._chan = self._conn.channel()
            self._chan.confirm_delivery()
        return self._chan

    def _drop(self) -> None:
        conn, self._conn, self._chan = self._conn, None, None
        if conn is not None and conn.is_open:
            # Already dead if the broker or the network closed it first.
            with contextlib.suppress(pika.exceptions.AMQPError):
                conn.close()
