"""Spark for the analytics tests: one SparkSession for the whole run.

Starting a JVM costs seconds on a small machine, so every in-process Spark test
shares :func:`spark` (``local[2]``, two shuffle partitions, no UI), built as the
worker builds its own (:func:`spark_sink.session.build`). Tests that need the
worker process start it through the gateway or :class:`spark_sink.service.Worker`.
A missing or old Java fails the run with the reason, never a skip.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import TYPE_CHECKING

import pytest

from spark_sink import session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MASTER = "local[2]"
PARTITIONS = 2


@pytest.fixture(scope="session")
def spark() -> Iterator[SparkSession]:
    try:
        session.check_java()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    built = session.build(MASTER, shuffle_partitions=PARTITIONS)
    yield built
    built.stop()


# The browser tests' Chromium, for the dashboard (tests/browser/conftest.py).
from tests.browser.conftest import browser  # noqa: E402, F401
