"""The proton side of an AMQP 1.0 bridge: one event-driven Container in its own thread.

Theory of operation
-------------------
python-qpid-proton is not thread-safe and its ``Container.run()`` blocks, so each
bridge runs its own Container in a daemon thread and nothing else touches proton
objects. The two threads meet in two mailboxes:

* **commands** (asyncio -> proton): a deque the asyncio side appends to, then pokes
  the Container through an :class:`~proton.reactor.EventInjector` (at most one poke
  pending at a time). Commands: send messages, settle received deliveries, grant
  credit, stop.
* **events** (proton -> asyncio): a deque the proton thread appends to, then wakes
  the loop with ``call_soon_threadsafe`` (at most one wake-up pending). Events:
  state changes, outcomes of sent messages, arrived messages.

**Sending.** Messages wait in ``pending`` in order and go out as their target's
sender link has credit (one link per target address, opened on demand, the least
recently used closed past ``max_links``). Each transfer is remembered until the
broker settles it; its outcome (accepted, released, modified, rejected) goes back
with the message's gateway position. When the connection is lost, every unsettled
transfer goes back to the front of ``pending`` and is sent again after reconnecting
(at-least-once: the broker may see it twice).

**Poison messages.** Some brokers end the whole session over one message (RabbitMQ
does for a ``user-id`` that is not the connection's user). When a session or
connection ends with an error condition from the broker, every transfer it left
unsettled gets a strike and is sent again one at a time, so the next failure names
its cause exactly; a message with ``STRIKES`` strikes is reported ``rejected`` with
the broker's error (and goes to the dead-letter feed) instead of looping forever.

**Receiving.** The receiver never prefetches on its own: it has exactly the credit
the asyncio side granted and has not yet used (``allowance``). Arrivals are held
unsettled until the asyncio side settles them; a new link after a reconnect gets the
unused allowance, and settlements for deliveries of a lost connection are ignored
(the broker gives those to us again). Each connection has a ``generation`` so the
asyncio side can tell arrivals of a lost connection from current ones.

**Connecting.** One URL at a time, in order (failover); any failure moves the link
to ``retrying`` and a timer reconnects after a capped exponential backoff with jitter.

**Guarded.** A bridge made at run time asks the gateway's guard (``reach``:
bridges.base.Reach) before each attempt. A URL naming a host is resolved here, by the
guard, and proton is given one address the guard allows (the first; after each failed
attempt of that URL the next, as proton itself would try them in turn), with the name
as the connection's ``virtual_host``: the Open frame's hostname and the TLS peer name
(SNI, and the certificate check of ``tls_verify``) stay the name's, while no second
DNS answer comes between the check and the socket. A refused address, or a name that
resolves only to refused ones, is a failed attempt that says why.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import os
import socket
import threading
import time
import urllib.parse
from collections.abc import Callable
from typing import Any

from proton import Condition, Delivery, Endpoint, Handler, Message, SSLDomain, Terminus
from proton.handlers import MessagingHandler
from proton.reactor import ApplicationEvent, Container, EventInjector, LinkOption

from .amqp_map import Unmappable, from_amqp
from .base import Reach, backoff
from .checks import redact
from .config import AmqpBridgeConfig

log = logging.getLogger(__name__)

CLOSE_GRACE = 2.0  # seconds a stopping bridge waits for the broker to confirm the close
HEALTHY = 10.0  # seconds a connection must last before the reconnect backoff resets
STRIKES = 3  # broker errors a message may be in flight for before it counts as rejected

# events sent to the asyncio side
State = tuple[str, str, str, str]  # ("state", state, url, error)
Outcome = tuple[int, str, str]  # (gateway position, outcome, error text)
Arrival = tuple[int, int, Any]  # (generation, delivery number, MessageSpec)


def _split_credentials(url: str) -> tuple[str, str, str]:
    """The URL without user and password (proton logs the URL it connects to), and them."""
    parts = urllib.parse.urlsplit(url)
    if parts.username is None and parts.password is None:
        return url, "", ""
    host = parts.hostname or ""
    if ":" in host:
        host = f"[{host}]"
    netloc = host + (f":{parts.port}" if parts.port else "")
    bare = urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, parts.query, ""))
    user = urllib.parse.unquote(parts.username or "")
    return bare, user, urllib.parse.unquote(parts.password or "")


def guarded(address: str, reach: Reach, turn: int) -> tuple[str, str]:
    """For a guarded bridge: the URL to connect to, and the host name it stands for
    ("": the URL's own). A URL naming a host becomes the URL of an address the guard
    allows that name to have now: the ``turn``-th, round the list (Guarded, above)."""
    parts = urllib.parse.urlsplit(address)
    host = parts.hostname or ""
    port = parts.port or (5671 if parts.scheme == "amqps" else 5672)
    allowed = reach.addresses(host, port, socket.AF_UNSPEC)
    checked = allowed[turn % len(allowed)]
    if checked == host:
        return address, ""
    netloc = f"[{checked}]" if ":" in checked else checked
    netloc += f":{parts.port}" if parts.port else ""
    return urllib.parse.urlunsplit((parts.scheme, netloc, parts.path, "", "")), host


class _Durable(LinkOption):
    """Terminus durability: RabbitMQ declares /queue/ targets and sources with it."""

    def __init__(self, durable: bool) -> None:
        self.durable = durable

    def apply(self, link: Any) -> None:
        terminus = link.source if link.is_receiver else link.target
        terminus.durability = Terminus.DELIVERIES if self.durable else Terminus.NONDURABLE


class _Timer(Handler):
    def __init__(self, callback: Callable[[], None]) -> None:
        super().__init__()
        self.callback = callback

    def on_timer_task(self, event: Any) -> None:
        self.callback()


class Link(MessagingHandler):
    """Runs a bridge's connection on the proton thread; see the module docstring."""

    def __init__(
        self,
        config: AmqpBridgeConfig,
        loop: asyncio.AbstractEventLoop,
        on_events: Callable[[list[tuple[Any, ...]]], None],
        *,
        max_message_size: int,
        reach: Reach | None = None,
    ) -> None:
        super().__init__(prefetch=0, auto_accept=False, auto_settle=True, peer_close_is_error=True)
        self.config = config
        self.max_message_size = max_message_size
        self._reach = reach  # a bridge made at run time: the guard (Guarded, above)
        self._loop = loop
        self._on_events = on_events
        self._lock = threading.Lock()
        self._commands: collections.deque[tuple[Any, ...]] = collections.deque()
        self._poked = False
        self._events: collections.deque[tuple[Any, ...]] = collections.deque()
        self._waking = False
        self._injector = EventInjector()
        os.set_blocking(self._injector.pipe[1], False)  # a poke never blocks the loop
        self._container = Container(self)
        self._container.selectable(self._injector)
        self._thread = threading.Thread(
            target=self._run, name=f"amqp-bridge-{config.name}", daemon=True
        )
        # proton-thread state
        self.generation = 0  # read by the asyncio side (an int: atomic)
        self._conn: Any = None
        self._url_index = -1
        self._turns: dict[int, int] = {}  # URL index -> failed attempts (Guarded, above)
        self._attempt = 0
        self._up = False
        self._opened_at = 0.0
        self._stopping = False
        self._closing: Any = None  # the connection being closed on stop
        self._ended = False
        self._senders: collections.OrderedDict[str, Any] = collections.OrderedDict()
        self._pending: collections.deque[tuple[int, str, Message]] = collections.deque()
        self._unsettled: dict[Any, tuple[int, str, Message]] = {}  # delivery -> what was sent
        self._strikes: dict[int, int] = {}  # position -> broker errors it was in flight for
        self._receiver: Any = None
        self._held: dict[int, Any] = {}  # delivery number -> unsettled inbound delivery
        self._number = 0
        self._allowance = 0

    # ------------------------------------------------------------ asyncio side
    def start(self) -> None:
        self._thread.start()

    def command(self, *command: Any) -> None:
        """Queue a command for the proton thread (thread-safe)."""
        self._commands.append(command)
        with self._lock:
            if self._poked:
                return
            self._poked = True
        self._injector.trigger(ApplicationEvent("bridge_commands"))

    def join(self, timeout: float) -> bool:
        """Wait for the thread to end (blocking: call it in a worker thread)."""
        self._thread.join(timeout)
        return not self._thread.is_alive()

    # ------------------------------------------------------------ proton thread: plumbing
    def _run(self) -> None:
        try:
            self._container.run()
        except Exception as exc:  # a bug in a handler: report it, the bridge restarts us
            log.exception("bridge %s: the proton thread failed", self.config.name)
            self._emit(("crashed", f"{type(exc).__name__}: {exc}"))
        finally:
            self._emit(("state", "stopped", "", ""))
            self._flush()

    def _emit(self, event: tuple[Any, ...]) -> None:
        """Queue an event for the loop; it is woken once the reactor has handled every
        event it had (``on_reactor_quiesced``), so one wake-up carries a whole pass."""
        self._events.append(event)

    def _flush(self) -> None:
        if not self._events:
            return
        with self._lock:
            if self._waking:
                return
            self._waking = True
        with contextlib.suppress(RuntimeError):  # a closed loop: nobody listens any more
            self._loop.call_soon_threadsafe(self._deliver)

    def on_reactor_quiesced(self, event: Any) -> None:
        self._flush()

    def _deliver(self) -> None:  # on the asyncio loop
        with self._lock:
            self._waking = False
        batch = []
        while self._events:
            batch.append(self._events.popleft())
        if batch:
            self._on_events(batch)

    def on_bridge_commands(self, event: Any) -> None:
        with self._lock:
            self._poked = False
        while self._commands:
            command = self._commands.popleft()
            getattr(self, f"_do_{command[0]}")(*command[1:])
        self._pump()

    # ------------------------------------------------------------ connecting
    def on_start(self, event: Any) -> None:
        self._connect()

    def _connect(self) -> None:
        if self._stopping:
            return
        config = self.config
        self._url_index = (self._url_index + 1) % len(config.urls)
        url = config.urls[self._url_index]
        self.generation += 1
        shown = redact(url)
        self._emit(("state", "connecting", shown, ""))
        try:
            address, user, password = _split_credentials(url)
            name = ""
            if self._reach is not None:
                turn = self._turns.get(self._url_index, 0)
                address, name = guarded(address, self._reach, turn)
        except OSError as exc:  # refused by the guard, or the name does not resolve
            self._conn = None
            self._failed(f"cannot connect to {shown}: {exc}")
            return
        try:
            user = user or config.user
            password = password or config.password
            options: dict[str, Any] = {
                "reconnect": False,
                "heartbeat": config.heartbeat or None,
                "sasl_enabled": True,
                "allow_insecure_mechs": True,
                "allowed_mechs": config.sasl or ("PLAIN" if user else "ANONYMOUS"),
            }
            if user:  # given apart from the URL, which proton writes to its log
                options["user"] = user
                options["password"] = password
            if url.startswith("amqps:"):
                options["ssl_domain"] = self._ssl_domain()
            if name:  # the Open frame's hostname and the TLS peer name (SNI, checked)
                options["virtual_host"] = name
            self._conn = self._container.connect(url=address, **options)
        except Exception as exc:  # a bad URL, a TLS file that cannot be read: a failed try
            self._conn = None
            self._failed(f"cannot connect to {shown}: {type(exc).__name__}: {exc}")
            return
        generation = self.generation
        self._container.schedule(config.connect_timeout, _Timer(lambda: self._timeout(generation)))
        if config.direction == "in":
            self._receiver = self._container.create_receiver(
                self._conn, config.source, options=_Durable(config.durable)
            )
        self._senders.clear()

    def _ssl_domain(self) -> SSLDomain:
        domain = SSLDomain(SSLDomain.MODE_CLIENT)
        if self.config.tls_ca:
            domain.set_trusted_ca_db(self.config.tls_ca)
        if self.config.tls_verify:
            domain.set_peer_authentication(SSLDomain.VERIFY_PEER_NAME, self.config.tls_ca or None)
        else:
            domain.set_peer_authentication(SSLDomain.ANONYMOUS_PEER)
        return domain

    def _timeout(self, generation: int) -> None:
        if generation == self.generation and not self._up and self._conn is not None:
            self._failed(f"no connection within {self.config.connect_timeout:g} s")

    def on_connection_opened(self, event: Any) -> None:
        if event.connection != self._conn:
            return
        self._up = True
        self._opened_at = time.monotonic()
        self._emit(("state", "up", redact(self.config.urls[self._url_index]), ""))
        if self._receiver is not None and self._allowance:
            self._receiver.flow(self._allowance)
        self._pump()

    def _failed(self, error: str, *, broker_error: bool = False) -> None:
        """The connection is lost or unusable: give back what is unsettled, retry later.

        ``broker_error``: the broker ended the session or connection with an error
        condition, which may be the fault of a message in flight (a strike each)."""
        conn, self._conn = self._conn, None
        if self._up and time.monotonic() - self._opened_at > HEALTHY:
            self._attempt = 0  # it worked for a while: start the backoff afresh
        self._turns[self._url_index] = self._turns.get(self._url_index, 0) + 1
        self._up = False
        self._receiver = None
        self._senders.clear()
        self._held.clear()  # the broker redelivers these to the next connection
        if self._unsettled:
            resend = sorted(self._unsettled.values(), key=lambda item: item[0])
            self._unsettled.clear()
            if broker_error:
                resend = self._strike(resend, error)
            self._pending.extendleft(reversed(resend))
        if conn is not None and not conn.state & Endpoint.LOCAL_CLOSED:
            try:
                conn.close()
            except Exception as exc:  # closing a broken connection can fail: it is gone anyway
                log.debug("bridge %s: closing a failed connection: %s", self.config.name, exc)
        if self._stopping:
            return
        self._attempt += 1
        delay = backoff(self._attempt, self.config.reconnect_min, self.config.reconnect_max)
        self._emit(("state", "retrying", "", error))
        log.warning("bridge %s: %s; reconnecting in %.1f s", self.config.name, error, delay)
        self._container.schedule(delay, _Timer(self._connect))

    def _strike(
        self, resend: list[tuple[int, str, Message]], error: str
    ) -> list[tuple[int, str, Message]]:
        keep = []
        for item in resend:
            strikes = self._strikes.get(item[0], 0) + 1
            if strikes >= STRIKES:
                self._strikes.pop(item[0], None)
                self._emit(("outcome", item[0], "rejected", error))
            else:
                self._strikes[item[0]] = strikes
                keep.append(item)
        return keep

    @staticmethod
    def _describe(condition: Any, what: str) -> str:
        if condition is None:
            return what
        text = f"{what}: {condition.name}"
        return f"{text}: {condition.description}" if condition.description else text

    def on_transport_error(self, event: Any) -> None:
        if event.connection == self._conn:
            self._failed(self._describe(event.transport.condition, "transport error"))

    def on_disconnected(self, event: Any) -> None:
        if self._stopping and event.connection == self._closing:
            self._end()
        elif event.connection == self._conn:
            condition = event.transport.condition if event.transport else None
            self._failed(self._describe(condition, "disconnected"))

    def on_connection_error(self, event: Any) -> None:
        if event.connection == self._conn:
            condition = event.connection.remote_condition
            error = self._describe(condition, "the broker closed the connection")
            self._failed(error, broker_error=condition is not None)

    def on_connection_closing(self, event: Any) -> None:
        if event.connection == self._conn:
            self._failed("the broker closed the connection")

    def on_session_error(self, event: Any) -> None:
        if event.connection == self._conn:
            condition = event.session.remote_condition
            self._failed(self._describe(condition, "session ended"), broker_error=True)

    def on_link_error(self, event: Any) -> None:
        link = event.link
        if event.connection != self._conn:
            return
        error = self._describe(link.remote_condition, f"link {link.name} refused")
        if link.is_receiver:
            self._failed(error)
            return
        # One sender failed (no such exchange, say): its messages go back to the
        # asyncio side to be retried later; the other targets carry on.
        target = next((t for t, s in self._senders.items() if s == link), None)
        if target is not None:
            del self._senders[target]
        self._return_unsettled(link, target, error)
        self._emit(("error", error))

    def on_link_closing(self, event: Any) -> None:
        if event.connection == self._conn and event.link.is_receiver:
            self._failed("the broker closed the receiving link")

    # ------------------------------------------------------------ stopping
    def _do_stop(self) -> None:
        """Close the connection (so the broker takes back what it had given us and stops
        delivering), then end the reactor once it is closed, or after a short grace."""
        self._stopping = True
        self._emit(("state", "stopping", "", ""))
        conn, self._conn = self._conn, None
        self._closing = conn
        if conn is not None and not conn.state & Endpoint.LOCAL_CLOSED and self._up:
            conn.close()
            self._container.schedule(CLOSE_GRACE, _Timer(self._end))
        else:
            self._end()

    def _end(self) -> None:
        if self._ended:
            return
        self._ended = True
        self._injector.close()
        self._container.stop()

    def on_connection_closed(self, event: Any) -> None:
        if self._stopping and event.connection == self._closing:
            self._end()

    # ------------------------------------------------------------ sending
    def _do_send(self, batch: list[tuple[int, str, Message]]) -> None:
        self._pending.extend(batch)

    def _sender(self, target: str) -> Any:
        sender = self._senders.get(target)
        if sender is not None:
            self._senders.move_to_end(target)
            return sender
        if len(self._senders) >= self.config.max_links:
            for old_target, old in list(self._senders.items()):
                if not old.unsettled:
                    del self._senders[old_target]
                    old.close()
                    break
        sender = self._container.create_sender(
            self._conn, target, options=_Durable(self.config.durable)
        )
        self._senders[target] = sender
        return sender

    def _pump(self) -> None:
        """Send pending messages in order while their links have credit."""
        if not self._up or self._conn is None:
            return
        pending = self._pending
        sent: list[int] = []
        while pending:
            seq, target, message = pending[0]
            if self._strikes and (seq in self._strikes) and (self._unsettled or sent):
                break  # a suspect goes alone, so a failure names it
            sender = self._sender(target)
            if sender.credit <= 0:
                break
            pending.popleft()
            delivery = sender.send(message)
            self._unsettled[delivery] = (seq, target, message)
            sent.append(seq)
            if seq in self._strikes:
                break
        if sent:
            self._emit(("sent", len(sent)))

    def on_sendable(self, event: Any) -> None:
        self._pump()

    def _outcome(self, event: Any, outcome: str) -> None:
        delivery = event.delivery
        sent = self._unsettled.pop(delivery, None)
        if sent is None:
            return
        if self._strikes:
            self._strikes.pop(sent[0], None)
        error = ""
        if outcome == "rejected":
            error = self._describe(delivery.remote.condition, "rejected by the broker")
        self._emit(("outcome", sent[0], outcome, error))

    def on_accepted(self, event: Any) -> None:
        self._outcome(event, "accepted")

    def on_rejected(self, event: Any) -> None:
        self._outcome(event, "rejected")

    def on_released(self, event: Any) -> None:
        state = event.delivery.remote_state
        self._outcome(event, "modified" if state == Delivery.MODIFIED else "released")

    def on_settled(self, event: Any) -> None:
        # settled without an outcome we know (or after a link error): try again later
        if event.delivery in self._unsettled:
            self._outcome(event, "released")

    def _return_unsettled(self, link: Any, target: str | None, error: str) -> None:
        """A sender link failed: its unsettled and pending messages go back to the
        asyncio side, which sends them again after a backoff."""
        for delivery in list(self._unsettled):
            if delivery.link == link:
                seq = self._unsettled.pop(delivery)[0]
                self._emit(("outcome", seq, "released", error))
        if target is None:
            return
        keep: collections.deque[tuple[int, str, Message]] = collections.deque()
        for item in self._pending:
            if item[1] == target:
                self._emit(("outcome", item[0], "released", error))
            else:
                keep.append(item)
        self._pending = keep

    # ------------------------------------------------------------ receiving
    def _do_credit(self, count: int) -> None:
        self._allowance += count
        if self._receiver is not None and self._up:
            self._receiver.flow(count)

    def on_message(self, event: Any) -> None:
        if event.connection != self._conn:
            return
        self._allowance -= 1
        delivery = event.delivery
        try:
            spec = from_amqp(
                event.message,
                address_from=self.config.address_from,
                max_size=self.max_message_size,
            )
        except Unmappable as exc:
            delivery.local.condition = Condition("amqp:decode-error", str(exc))
            self.reject(delivery)
            self._allowance += 1
            event.link.flow(1)
            self._emit(("refused", str(exc)))
            return
        self._number += 1
        self._held[self._number] = delivery
        self._emit(("arrived", self.generation, self._number, spec))

    def _do_settle(self, decisions: list[tuple[int, str, str]]) -> None:
        for number, outcome, reason in decisions:
            delivery = self._held.pop(number, None)
            if delivery is None:
                continue  # of a lost connection: the broker redelivers it
            if outcome == "accept":
                self.accept(delivery)
            elif outcome == "reject":
                delivery.local.condition = Condition("amqp:precondition-failed", reason)
                self.reject(delivery)
            else:  # "release": back to the broker, not counted as a delivery attempt
                self.release(delivery, delivered=False)
