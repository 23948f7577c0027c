"""``scripts/cluster``: the project's Redis Cluster on 127.0.0.1:7101-7106 (or where
``RESTMS_CLUSTER_BASE_PORT`` puts it, tests/nodes.py), for real.

It comes up formed (3 masters, 3 replicas, every slot served, AOF with fsync at every
write), ``up`` again changes nothing, a master killed with SIGKILL is replaced by its
replica and ``up`` brings the killed one back as a replica, ``down`` stops only what
the script started and ``up`` after it finds the same cluster. The machine's own
Redis on 6379 is never touched. Each step is bounded; the test fails loudly (never
skips) when the cluster cannot be had.
"""

from __future__ import annotations

import os
import signal
import subprocess
import time
from pathlib import Path

import pytest
import redis as redis_py

from tests.nodes import PORTS

# Alone: the project's cluster is stopped and started again.
pytestmark = pytest.mark.alone

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "scripts" / "cluster"
DIR = Path(os.environ.get("RESTMS_CLUSTER_DIR", "/var/tmp/restms-cluster"))


def cluster(verb: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(SCRIPT), verb], capture_output=True, text=True, timeout=120, check=False
    )


def redis(port: int, *command: str) -> str:
    done = subprocess.run(
        ["redis-cli", "-h", "127.0.0.1", "-p", str(port), *command],
        capture_output=True,
        text=True,
        timeout=10,
        check=False,
    )
    return done.stdout.strip()


def roles() -> dict[int, str]:
    return {port: redis(port, "ROLE").splitlines()[0] for port in PORTS}


def node_ids() -> set[str]:
    return {redis(port, "CLUSTER", "MYID") for port in PORTS}


def until(check: object, what: str, timeout: float = 30.0) -> None:
    assert callable(check)
    deadline = time.monotonic() + timeout
    while not check():
        assert time.monotonic() < deadline, f"not within {timeout} s: {what}"
        time.sleep(0.2)


def held(port: int, keys: list[str]) -> int:
    """How many of ``keys`` (of one slot) the instance on ``port`` holds itself, a
    replica included (0: another instance serves their slot)."""
    with redis_py.Redis(host="127.0.0.1", port=port) as one:
        one.execute_command("READONLY")
        try:
            return int(one.exists(*keys))
        except redis_py.exceptions.MovedError:
            return 0


def up() -> None:
    done = cluster("up")
    assert done.returncode == 0, done.stderr


def test_the_cluster_comes_up_formed_and_durable() -> None:
    up()
    info = redis(PORTS[0], "CLUSTER", "INFO")
    assert "cluster_state:ok" in info
    assert "cluster_slots_assigned:16384" in info
    assert "cluster_known_nodes:6" in info
    assert sorted(roles().values()) == ["master"] * 3 + ["slave"] * 3
    for port in PORTS:
        assert redis(port, "CONFIG", "GET", "appendonly").splitlines() == ["appendonly", "yes"]
        assert redis(port, "CONFIG", "GET", "appendfsync").splitlines() == [
            "appendfsync",
            "always",
        ]
        assert redis(port, "CONFIG", "GET", "bind").splitlines()[1] == "127.0.0.1"
    assert (DIR.stat().st_mode & 0o777) == 0o700
    status = cluster("status")
    assert status.returncode == 0
    assert "cluster_state: ok" in status.stdout


def test_up_again_changes_nothing() -> None:
    up()
    before = {port: (DIR / str(port) / "redis.pid").read_text() for port in PORTS}
    ids = node_ids()
    up()
    assert {port: (DIR / str(port) / "redis.pid").read_text() for port in PORTS} == before
    assert node_ids() == ids


def test_a_killed_master_is_replaced_and_comes_back_as_a_replica() -> None:
    up()
    master = next(port for port, role in roles().items() if role == "master")
    key = "{cluster-script-test}"
    assert redis(master, "-c", "SET", key, "kept") == "OK"
    os.kill(int((DIR / str(master) / "redis.pid").read_text()), signal.SIGKILL)

    def replaced() -> bool:
        alive = [port for port in PORTS if port != master]
        return sum(redis(port, "ROLE").startswith("master") for port in alive) == 3

    until(replaced, "a replica promoted in the killed master's place")
    assert cluster("status").returncode != 0  # one instance down: status says so
    up()  # starts the killed one again; it rejoins as a replica
    assert roles()[master] == "slave"
    assert redis(master, "-c", "GET", key) == "kept"


def test_down_stops_only_what_it_started_and_up_finds_the_same_cluster() -> None:
    up()
    own_redis = redis(6379, "PING")  # the machine's own Redis, if it runs, is left alone
    ids = node_ids()
    done = cluster("down")
    assert done.returncode == 0, done.stderr
    for port in PORTS:
        assert redis(port, "PING") != "PONG"
        assert not (DIR / str(port) / "redis.pid").exists()
    assert redis(6379, "PING") == own_redis
    up()
    assert node_ids() == ids  # the same nodes, from their cluster state files


def test_up_returns_once_every_instance_has_its_data_loaded() -> None:
    """After ``up`` every instance answers at once: none still loading its append-only
    file, no replica still loading what its master sent it. 48 MiB in one slot make
    the loading long enough to be seen."""
    up()
    keys = [f"{{cluster-script-loading}}:{i}" for i in range(48)]
    client = redis_py.RedisCluster(host="127.0.0.1", port=PORTS[0])
    try:
        for key in keys:
            client.set(key, b"x" * 2**20)
        done = cluster("down")
        assert done.returncode == 0, done.stderr
        up()
        sizes = {port: redis(port, "DBSIZE") for port in PORTS}
        assert all(size.isdigit() for size in sizes.values()), sizes  # none "LOADING ..."
        assert sorted(held(port, keys) for port in PORTS) == [0, 0, 0, 0, 48, 48]
    finally:
        cluster("up")  # (a failed check above may have left it settling)
        client = redis_py.RedisCluster(host="127.0.0.1", port=PORTS[0])
        client.delete(*keys)
        client.close()
