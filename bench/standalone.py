"""A Spark standalone cluster on 127.0.0.1 from the PySpark distribution: one master and
one worker of bounded memory, for the test and the figures that run the analytics on a
``spark://`` master (docs/ANALYTICS.md, "Running on a cluster").

Both daemons are ``bin/spark-class`` processes of the installed PySpark, each in a
session of its own (so stopping them reaches their JVM), bound to 127.0.0.1 on free
ports, without the master's REST submission server. :class:`Cluster` starts them, waits
until the master lists the worker as alive (its ``/json/`` page), and stops both,
killing what does not end within a few seconds.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Any

from bench.common import free_port

START_WAIT = 120.0  # seconds both daemons have to come up (a loaded 2-core machine)
STOP_WAIT = 10.0


def spark_home() -> Path:
    import pyspark

    return Path(pyspark.__file__).resolve().parent


class Cluster:
    """A master and a worker: :meth:`start` (which returns once the worker is alive),
    then :meth:`stop`; ``url`` is the master URL (``spark://127.0.0.1:PORT``)."""

    def __init__(self, logs: Path, *, memory: str = "1g", cores: int = 1) -> None:
        self.logs = logs
        self.memory, self.cores = memory, cores
        self.port, self.ui = free_port(), free_port()
        self.url = f"spark://127.0.0.1:{self.port}"
        self._processes: list[subprocess.Popen[bytes]] = []

    def _spawn(self, name: str, *args: str) -> None:
        home = spark_home()
        env = {
            **os.environ,
            "SPARK_HOME": str(home),
            "SPARK_LOCAL_IP": "127.0.0.1",
            "SPARK_DAEMON_MEMORY": "256m",
            "SPARK_MASTER_OPTS": "-Dspark.master.rest.enabled=false",
            "SPARK_NO_DAEMONIZE": "1",
        }
        self.logs.mkdir(parents=True, exist_ok=True)
        with open(self.logs / f"{name}.log", "ab") as log:
            process = subprocess.Popen(
                [str(home / "bin" / "spark-class"), *args],
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        self._processes.append(process)

    def state(self) -> dict[str, Any]:
        """The master's own view (its web UI's JSON), or {} while it does not answer."""
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{self.ui}/json/", timeout=5) as r:
                found: dict[str, Any] = json.loads(r.read())
                return found
        except OSError:
            return {}

    def start(self) -> Cluster:
        master = "org.apache.spark.deploy.master.Master"
        self._spawn("master", master, "--host", "127.0.0.1", "--port", str(self.port),
                    "--webui-port", str(self.ui))  # fmt: skip
        worker = "org.apache.spark.deploy.worker.Worker"
        self._spawn("worker", worker, "--host", "127.0.0.1", "--webui-port", str(free_port()),
                    "--cores", str(self.cores), "--memory", self.memory, self.url)  # fmt: skip
        deadline = time.monotonic() + START_WAIT
        while time.monotonic() < deadline:
            if self.state().get("aliveworkers", 0) >= 1:
                return self
            if any(p.poll() is not None for p in self._processes):
                break
            time.sleep(0.5)
        self.stop()
        raise RuntimeError(f"the Spark standalone cluster did not start (logs in {self.logs})")

    def stop(self) -> None:
        """Stop the worker, then the master (their whole sessions: the JVMs)."""
        for process in reversed(self._processes):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGTERM)
        for process in reversed(self._processes):
            try:
                process.wait(STOP_WAIT)
            except subprocess.TimeoutExpired:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(process.pid, signal.SIGKILL)
                process.wait(STOP_WAIT)
        self._processes.clear()
