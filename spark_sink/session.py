"""The SparkSession the analytics jobs run in (docs/ANALYTICS.md, "Running on a cluster").

Theory of operation. Every Spark job of the gateway runs in one session built here:
in the analytics worker process (:mod:`spark_sink.worker`), in ``main.py analytics``
and in the tests. The master is ``local[*]`` (Spark embedded in that process, one
task slot per core) unless configured otherwise (``spark://host:7077``,
``k8s://https://...``, ``yarn``): the lake must then be a URI the cluster's
executors can read (``s3a://``, ``hdfs://``, a shared file system).

The session is built for small machines: no web UI, no console progress bars, few
shuffle partitions (aggregates here are small: feeds times buckets), UTC as the
session time zone so that buckets and partition values agree with the lake's layout.

PySpark 4 needs Java 17 or newer; :func:`check_java` says so plainly before Spark
tries to start a JVM that is missing or too old.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
from collections.abc import Mapping
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from pyspark.sql import SparkSession

JAVA_MAJOR = 17
APP_NAME = "restms-analytics"
_VERSION = re.compile(r'version "(\d+)(?:\.(\d+))?')


def java_binary() -> str | None:
    home = os.environ.get("JAVA_HOME")
    if home and os.access(os.path.join(home, "bin", "java"), os.X_OK):
        return os.path.join(home, "bin", "java")
    return shutil.which("java")


def check_java() -> str:
    """The version line of the Java that Spark will use; RuntimeError when there is
    none or it is older than 17 (blocking: runs ``java -version``)."""
    java = java_binary()
    if java is None:
        raise RuntimeError(
            f"Spark needs Java {JAVA_MAJOR} or newer and none was found (set JAVA_HOME "
            "or put java on PATH; scripts/services checks this)"
        )
    done = subprocess.run(  # noqa: S603 - a fixed argument list, no shell
        [java, "-version"], capture_output=True, text=True, timeout=30, check=False
    )
    line = (done.stderr or done.stdout).strip().splitlines()[:1]
    found = _VERSION.search(line[0]) if line else None
    if found is None:
        raise RuntimeError(f"cannot tell the version of {java}: {line}")
    major = int(found[1]) if found[1] != "1" else int(found[2] or 0)
    if major < JAVA_MAJOR:
        raise RuntimeError(f"Spark needs Java {JAVA_MAJOR} or newer; {java} is Java {major}")
    return line[0]


def build(
    master: str = "local[*]",
    *,
    shuffle_partitions: int = 4,
    memory: str = "1g",
    extra: Mapping[str, str] | None = None,
) -> SparkSession:
    """The session (Spark's getOrCreate: a second call in a process returns the first)."""
    from pyspark.sql import SparkSession

    builder = (
        SparkSession.builder.master(master)
        .appName(APP_NAME)
        .config("spark.ui.enabled", "false")
        .config("spark.ui.showConsoleProgress", "false")
        .config("spark.sql.session.timeZone", "UTC")
        .config("spark.sql.shuffle.partitions", str(shuffle_partitions))
        .config("spark.driver.memory", memory)
        .config("spark.sql.streaming.forceDeleteTempCheckpointLocation", "true")
    )
    for key, value in (extra or {}).items():
        builder = builder.config(key, value)
    session = builder.getOrCreate()
    session.sparkContext.setLogLevel("WARN")
    return session
