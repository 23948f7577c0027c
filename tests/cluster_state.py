"""Fixtures for tests of the state gateway nodes share in the project's Redis Cluster
(127.0.0.1:7101-7106, ``scripts/cluster up``; tests/nodes.py says how to move it):
each test has a namespace of its own, whose keys are deleted after it. A test that
needs the cluster fails, never skips, when it cannot be had.

Also what the failure tests (a master killed or stopped) need of the cluster's
instances: which one is a slot's master, its pid, and the cluster brought back whole
afterwards."""

from __future__ import annotations

import dataclasses
import os
import signal
import subprocess
import time
import uuid
from collections.abc import AsyncIterator, Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster
from redis.exceptions import RedisError

from auth.cluster import Shared
from tests import nodes
from tests.integration.test_cluster_script import DIR as CLUSTER_DIR
from tests.integration.test_cluster_script import redis as _redis_cli
from tests.sites import free_port

ROOT = Path(__file__).resolve().parents[1]
URL = nodes.CLUSTER_URL
PORTS = nodes.PORTS
DEAD = "redis://127.0.0.1:7199"  # nothing listens there: a cluster that does not answer
NODE_TIMEOUT = 3.0  # scripts/cluster's cluster-node-timeout


@pytest.fixture(scope="session")
def redis_cluster() -> str:
    """The seed URL of the project's cluster, brought up (idempotently) once a session."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "cluster"), "up"],
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )
    if done.returncode != 0:
        pytest.fail(f"scripts/cluster up failed: {done.stderr.strip()}", pytrace=False)
    return URL


@pytest.fixture
async def namespace(redis_cluster: str) -> AsyncIterator[str]:
    """A key namespace no other test uses; its keys are deleted after the test."""
    name = f"test-{uuid.uuid4().hex[:12]}"
    yield name
    cleaner = Shared.open(redis_cluster, name)
    try:
        async for key in cleaner.redis.scan_iter(match=f"{{{name}:*"):
            await cleaner.redis.delete(key)
    finally:
        await cleaner.close()


@pytest.fixture
async def shared(redis_cluster: str, namespace: str) -> AsyncIterator[Shared]:
    """One connection to the cluster in the test's namespace."""
    state = Shared.open(redis_cluster, namespace)
    yield state
    await state.close()


@pytest.fixture
async def other(redis_cluster: str, namespace: str) -> AsyncIterator[Shared]:
    """Another connection to the same namespace: what a second node sees."""
    state = Shared.open(redis_cluster, namespace)
    yield state
    await state.close()


@pytest.fixture
async def dead() -> AsyncIterator[Shared]:
    """A connection to a cluster that does not answer."""
    state = Shared.open(DEAD, "dead")
    yield state
    await state.close()


@dataclasses.dataclass
class PrivateCluster:
    """A one-master Redis Cluster of the test's own (its own ports and directories), with
    a replica when asked, which the test may kill: the project's cluster is shared with
    others and never is."""

    url: str
    processes: list[subprocess.Popen[bytes]]
    bus: dict[int, int] = dataclasses.field(default_factory=dict)  # port -> its bus port

    def kill(self) -> None:
        """SIGKILL: the cluster stops answering at once."""
        for process in self.processes:
            if process.poll() is None:
                os.kill(process.pid, signal.SIGKILL)

    def wait(self) -> None:
        for process in self.processes:
            process.wait(timeout=10)


@pytest.fixture
def private_cluster(tmp_path: Path, redis_cluster: str) -> Iterator[PrivateCluster]:
    """Started before the test (the project's cluster up proves redis-server is there)
    and killed after it."""
    cluster = start_private_cluster(tmp_path, free_port())
    try:
        yield cluster
    finally:
        cluster.kill()
        cluster.wait()


def start_private_cluster(tmp_path: Path, port: int, replica: bool = False) -> PrivateCluster:
    """A cluster whose one master on ``port`` serves every slot, with a replica on a
    free port if asked (the caller kills it)."""
    cluster = PrivateCluster(url=f"redis://127.0.0.1:{port}", processes=[])
    try:
        _instance(tmp_path, port, cluster)
        _redis_cli(port, "CLUSTER", "ADDSLOTSRANGE", "0", "16383")
        _until(lambda: "cluster_state:ok" in _redis_cli(port, "CLUSTER", "INFO"), "it serves")
        if replica:
            second = free_port()
            _instance(tmp_path, second, cluster)
            master = _redis_cli(port, "CLUSTER", "MYID")
            _redis_cli(second, "CLUSTER", "MEET", "127.0.0.1", str(port), str(cluster.bus[port]))
            _until(lambda: master in _redis_cli(second, "CLUSTER", "NODES"), "the replica meets")
            _redis_cli(second, "CLUSTER", "REPLICATE", master)
            _until(
                lambda: "master_link_status:up" in _redis_cli(second, "INFO", "replication"),
                "the replica has the master's data",
            )
    except BaseException:
        cluster.kill()
        cluster.wait()
        raise
    return cluster


def _instance(tmp_path: Path, port: int, cluster: PrivateCluster) -> None:
    """A cluster-enabled redis-server on ``port``, answering, added to ``cluster``."""
    bus = free_port()  # given: port + 10000 may not exist
    cluster.bus[port] = bus
    home = tmp_path / f"private-redis-{port}"
    home.mkdir()
    process = subprocess.Popen(
        [
            "redis-server",
            "--port", str(port), "--bind", "127.0.0.1", "--dir", str(home),
            "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
            "--cluster-port", str(bus),
            "--save", "", "--appendonly", "no", "--logfile", str(home / "redis.log"),
        ],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    cluster.processes.append(process)
    _until(
        lambda: _redis_cli(port, "PING") == "PONG" or process.poll() is not None,
        "the private redis-server answers",
    )
    if process.poll() is not None:
        log = (home / "redis.log").read_text(errors="replace")[-2000:]
        pytest.fail(f"the private redis-server exited: {log}", pytrace=False)


def _until(check: Callable[[], bool], what: str, timeout: float = 10.0) -> None:
    deadline = time.monotonic() + timeout
    while not check():
        if time.monotonic() > deadline:
            pytest.fail(f"not within {timeout} s: {what}", pytrace=False)
        time.sleep(0.05)


async def master_port(key: str) -> int:
    """The port of the instance that is the master of ``key``'s slot now."""
    cluster = RedisCluster.from_url(nodes.CLUSTER_URL, **nodes.BOUNDED)
    try:
        await cluster.initialize()
        return int(cluster.get_node_from_key(key).port)
    finally:
        await cluster.aclose()


def instance_pid(port: int) -> int:
    """The pid of the project's instance on ``port`` (its pid file)."""
    return int((CLUSTER_DIR / str(port) / "redis.pid").read_text())


async def role(port: int) -> list[Any]:
    """``ROLE`` of the instance on ``port``; bounded: a stopped one raises TimeoutError."""
    async with Redis(
        host="127.0.0.1", port=port, driver_info=nodes.DRIVER, socket_timeout=1.0
    ) as instance:
        return list(await instance.execute_command("ROLE"))


async def whole() -> bool:
    """Every slot served, and three masters each with one replica whose link is up (a
    replica still loading its copy says so): the cluster as the next test needs it."""
    try:
        roles = {port: await role(port) for port in PORTS}
        async with Redis(host="127.0.0.1", port=PORTS[0], **nodes.BOUNDED) as first:
            info = (await first.execute_command("CLUSTER", "INFO")).decode()
    except (RedisError, OSError):
        return False
    masters = {port for port, r in roles.items() if r[0] == b"master"}
    linked = [int(r[2]) for r in roles.values() if r[0] == b"slave" and r[3] == b"connected"]
    return (
        "cluster_state:ok" in info
        and "cluster_slots_assigned:16384" in info
        and len(masters) == 3
        and sorted(linked) == sorted(masters)
    )


def cluster_up() -> None:
    """``scripts/cluster up``: whatever instance is down started again (it rejoins as a
    replica), and every slot served with three masters and three replicas."""
    done = subprocess.run(
        [str(ROOT / "scripts" / "cluster"), "up"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert done.returncode == 0, done.stderr
