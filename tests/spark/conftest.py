"""Spark for the analytics tests: one SparkSession for the whole run.

Starting a JVM costs seconds on a small machine, so every in-process Spark test
shares :func:`spark` (``local[2]``, two shuffle partitions, no UI), built as the
worker builds its own (:func:`spark_sink.session.build`). Tests that need the
worker process start it through the gateway or :class:`spark_sink.service.Worker`.
A missing or old Java fails the run with the reason, never a skip.

Every JVM of the run (this session's and the workers', which inherit the environment)
reads the test-only settings in ``tests/spark/conf`` through ``SPARK_CONF_DIR``: JVM
flags for short jobs on a small machine, nothing that changes an answer.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

from spark_sink import session

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

MASTER = "local[2]"
PARTITIONS = 2
# A gateway's settings for its own Spark worker in the tests: the streaming job's
# trigger is short because sync() waits for the next one.
WORKER_SETTINGS = {
    "analytics_master": MASTER,
    "analytics_partitions": PARTITIONS,
    "analytics_stream_interval": 1.0,
}
CONF_DIR = Path(__file__).resolve().parent / "conf"


@pytest.fixture(scope="session", autouse=True)
def spark_conf() -> Iterator[None]:
    """The test-only Spark settings for every JVM the Spark tests start."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SPARK_CONF_DIR", os.fspath(CONF_DIR))
        yield


@pytest.fixture(scope="session")
def spark(spark_conf: None) -> Iterator[SparkSession]:
    try:
        session.check_java()
    except RuntimeError as exc:
        pytest.fail(str(exc), pytrace=False)
    built = session.build(MASTER, shuffle_partitions=PARTITIONS)
    yield built
    built.stop()
