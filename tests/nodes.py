"""Several gateway nodes on the Redis Cluster engine behind a round-robin proxy.

A test module marked ``pytest.mark.nodes`` runs each of its tests twice: on one
gateway (the embedded engine), and on three nodes of the cluster engine that share
one key namespace, each request sent to the next node in turn (tests/roundrobin.py):
a pipe made through one node is read through another, published to through a third
and acknowledged through the first, as a load balancer with no sticky sessions does.
Only the namespace is the test's own, on the project's cluster (127.0.0.1:7101-7106,
``scripts/cluster up``); its keys are deleted afterwards.

Every test finds the cluster here: ``RESTMS_CLUSTER_BASE_PORT`` (as ``scripts/cluster``
reads it; 7100 by default) moves it to BASE+1..BASE+6, so a developer may run the
tests that stop or kill masters on a cluster of their own.
"""

from __future__ import annotations

import asyncio
import os
import secrets
from collections.abc import Awaitable, Callable
from typing import Any

import redis
from aiohttp import web
from redis.asyncio import Redis
from redis.asyncio.cluster import RedisCluster

from tests.roundrobin import RoundRobinProxy

NODES = 3
BASE_PORT = int(os.environ.get("RESTMS_CLUSTER_BASE_PORT", "7100"))
PORTS = range(BASE_PORT + 1, BASE_PORT + 7)  # the cluster's six instances
CLUSTER_URL = f"redis://127.0.0.1:{PORTS[0]}"
TOPOLOGIES = ("one", "three-nodes")
# Given, so that making a client does not read the package's metadata from disk (a
# blocking call on the event loop).
DRIVER = redis.DriverInfo(lib_version=redis.__version__)
# Seconds any one call of these helpers may wait on the cluster: a hung teardown shows
# as this call's error, not as the whole test's timeout with its stack lost.
WAIT = 15.0
BOUNDED = {"driver_info": DRIVER, "socket_timeout": WAIT, "socket_connect_timeout": WAIT}


def namespace() -> str:
    """A namespace of the test's own on the shared cluster."""
    return f"restms-test-{secrets.token_hex(6)}"


async def forget(name: str) -> None:
    """Delete every key of the namespace ``name`` on every master."""
    cluster = RedisCluster.from_url(CLUSTER_URL, **BOUNDED)
    try:
        await cluster.initialize()
        for node in cluster.get_primaries():
            async with Redis(host=node.host, port=node.port, **BOUNDED) as master:
                keys = [key async for key in master.scan_iter(match=f"{{{name}:*", count=1000)]
            for key in keys:  # one at a time: keys of several slots cannot share one
                await cluster.unlink(key)
    finally:
        await cluster.aclose()


async def owner_pid(namespace: str, name: str, kind: str = "hook") -> int:
    """The process id of the node holding the lock of a webhook pipe (or a bridge: kind
    "bridge"); the lock's value names the node (host, process id, a random part), then
    the token."""
    cluster = RedisCluster.from_url(CLUSTER_URL, **BOUNDED)
    try:
        held = await cluster.get(f"{{{namespace}:own}}:{kind}:{name}")
    finally:
        await cluster.aclose()
    assert held is not None, "nobody holds the pipe"
    return int(held.decode().split(" ")[0].split(":")[1])


Closer = Callable[[], Awaitable[None]]
Serve = Callable[[Any], Awaitable[tuple[web.Application, Any, str]]]


async def start(
    serve: Serve, config: Callable[..., Any], overrides: dict[str, Any]
) -> tuple[web.Application, str, list[Closer]]:
    """Three nodes of one gateway (``serve`` each with ``config(**overrides)`` on the
    cluster engine, a data directory each) and the proxy in front: the first node's
    app, the proxy's URL and what stops them all, in order."""
    name = namespace()
    # The proxy first: the nodes serve its address (the Host clients send), as nodes
    # behind a load balancer are told the names clients use.
    proxy = await RoundRobinProxy([]).start()
    served = ", ".join(filter(None, [overrides.get("allowed_hosts"), proxy.host]))
    closers: list[Closer] = [proxy.close]
    settings = [
        {
            **overrides,
            "allowed_hosts": served,
            "engine": "redis",
            "redis_url": CLUSTER_URL,
            "redis_namespace": name,
            "data_dir": f"{overrides['data_dir']}-node{i}",
        }
        for i in range(NODES)
    ]
    # Started together: each node's start is mostly waiting for the cluster.
    started = await asyncio.gather(
        *(serve(config(port=0, **each)) for each in settings), return_exceptions=True
    )
    apps = []
    for outcome in started:
        if not isinstance(outcome, BaseException):
            app, runner, url = outcome
            closers.append(runner.cleanup)
            apps.append(app)
            proxy.add(url)
    failed = next((o for o in started if isinstance(o, BaseException)), None)
    if failed is not None:
        for close in closers:
            await close()
        await forget(name)
        raise failed

    async def forget_namespace() -> None:
        await forget(name)

    return apps[0], proxy.url, [*closers, forget_namespace]
