"""Fixtures for tests against the real RabbitMQ on 127.0.0.1:5672 (``scripts/services``).

``broker`` (session) is a ``tests.integration.broker.Broker``; a test that asks for it
fails, never skips, when RabbitMQ or its AMQP 1.0 plugin is not there. ``queue_name``
is a fresh queue name, deleted after the test with every queue the test passed to
``broker.track``. After each test that used the broker, its app is started again if
the test stopped it (``broker.stop_app``) and did not start it, pass or fail, so the
tests after it have a broker.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pika.exceptions
import pytest

from tests.integration.broker import Broker, BrokerUnavailable, amqp1_handshake


@pytest.fixture(scope="session")
def broker() -> Iterator[Broker]:
    """The local RabbitMQ, checked once: AMQP 0-9-1 and AMQP 1.0 logins as guest."""
    b = Broker()
    problem = None
    try:
        b.wait_ready(timeout=10)
        amqp1_handshake(timeout=10)
    except (BrokerUnavailable, pika.exceptions.AMQPError) as exc:
        problem = str(exc) or repr(exc)
    if problem is not None:  # failed outside the except block: no chained traceback
        b.close()
        pytest.fail(
            f"RabbitMQ with its AMQP 1.0 plugin is needed on {b.host}:{b.port} "
            f"(guest/guest): {problem}. Run scripts/services to install, start and "
            "configure it.",
            pytrace=False,
        )
    yield b
    try:
        b.ensure_app_running()
    finally:
        b.close()


@pytest.fixture(autouse=True)
def _broker_cleanup(request: pytest.FixtureRequest) -> Iterator[None]:
    """After a test that used ``broker``: start its app again if need be, drop its queues.

    Autouse, so it is set up before and torn down after the test's other fixtures
    (a gateway still consuming from a test queue is gone by then).
    """
    if "broker" not in request.fixturenames:
        yield
        return
    b: Broker = request.getfixturevalue("broker")
    yield
    b.cleanup()


@pytest.fixture
def queue_name(broker: Broker) -> str:
    """A queue name no other test uses (not declared), deleted after the test."""
    return broker.track(f"restms-test-{uuid.uuid4().hex[:12]}")
