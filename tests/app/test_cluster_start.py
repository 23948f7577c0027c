"""Starting a node on the cluster engine, with real processes: a node started before its
cluster can serve (a cluster failing over, a seed node restarting and loading its
data) waits for it, as long as ``redis_start_wait`` says, instead of exiting; and a
node reaches the cluster through any of several seed nodes when the first does not
answer. A cluster that cannot keep a write (no replica) stops the start with a
reason."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import pytest

from tests import nodes
from tests.app.process import listening_port, main_py, start
from tests.cluster_state import (
    PrivateCluster,
    namespace,
    private_cluster,
    redis_cluster,
    start_private_cluster,
)
from tests.sites import free_port

pytestmark = pytest.mark.app

__all__ = ["namespace", "private_cluster", "redis_cluster"]  # fixtures

JSON = {"Accept": "application/restms+json"}


@contextlib.asynccontextmanager
async def serving(tmp_path: Path, url: str, name: str) -> AsyncIterator[asyncio.subprocess.Process]:
    """``main.py serve --engine redis`` on the cluster ``url``, stopped after."""
    proc = await start(
        "--engine", "redis", "--port", "0", "--data-dir", str(tmp_path / "var"),
        env={"RESTMS_REDIS_URL": url, "RESTMS_REDIS_NAMESPACE": name},
    )  # fmt: skip
    try:
        yield proc
    finally:
        if proc.returncode is None:
            proc.terminate()
        async with asyncio.timeout(30):
            await proc.wait()


async def test_a_node_started_before_its_cluster_serves_once_the_cluster_is_up(
    tmp_path: Path, redis_cluster: str, namespace: str
) -> None:
    port = free_port()  # the cluster's, once it runs
    async with serving(tmp_path, f"redis://127.0.0.1:{port}", namespace) as proc:
        assert proc.stderr is not None
        async with asyncio.timeout(20):
            line = ""
            while "waiting up to 30 s for the cluster" not in line:
                line = (await proc.stderr.readline()).decode()
                assert line, "the node exited instead of waiting for its cluster"
        assert proc.returncode is None
        cluster = await asyncio.to_thread(start_private_cluster, tmp_path, port, replica=True)
        try:
            gateway = await listening_port(proc)
            async with (
                aiohttp.ClientSession() as http,
                http.get(f"http://127.0.0.1:{gateway}/restms/domain/default", headers=JSON) as r,
            ):
                assert r.status == 200, await r.text()
        finally:
            cluster.kill()
            await asyncio.to_thread(cluster.wait)


async def test_a_node_reaches_the_cluster_through_a_later_seed(
    tmp_path: Path, redis_cluster: str, namespace: str
) -> None:
    seeds = f"redis://127.0.0.1:{free_port()}, {nodes.CLUSTER_URL}"  # nothing on the first
    async with serving(tmp_path, seeds, namespace) as proc:
        gateway = await listening_port(proc)
        url = f"http://127.0.0.1:{gateway}/restms/domain/default"
        async with aiohttp.ClientSession() as http:
            async with http.post(
                url,
                data=b'{"restms":{"pipe":[{}]}}',
                headers={**JSON, "Content-Type": "application/restms+json"},
            ) as r:
                assert r.status == 201, await r.text()
                pipe = r.headers["Location"]
            async with http.get(pipe, headers=JSON) as r:
                assert r.status == 200, await r.text()


async def test_a_cluster_that_cannot_keep_a_write_stops_the_start_with_a_reason(
    tmp_path: Path, namespace: str, private_cluster: PrivateCluster
) -> None:
    """A cluster without a replica cannot confirm a durable write: the node says so and
    exits 1, with no traceback."""
    status, _, err = await main_py(
        "serve", "--engine", "redis", "--port", "0", "--data-dir", str(tmp_path / "var"),
        env={"RESTMS_REDIS_URL": private_cluster.url, "RESTMS_REDIS_NAMESPACE": namespace},
    )  # fmt: skip
    assert status == 1, err
    assert "cannot start: no replica confirmed the write in time" in err, err
    assert private_cluster.url in err, err
    assert "Traceback" not in err, err


async def test_a_node_waiting_for_its_cluster_stops_at_once_on_sigterm(
    tmp_path: Path, namespace: str
) -> None:
    async with serving(tmp_path, f"redis://127.0.0.1:{free_port()}", namespace) as proc:
        assert proc.stderr is not None
        async with asyncio.timeout(20):
            while "waiting up to 30 s" not in (await proc.stderr.readline()).decode():
                assert proc.returncode is None, "the node exited instead of waiting"
        proc.send_signal(signal.SIGTERM)
        async with asyncio.timeout(5):  # not the rest of the 30 s
            assert await proc.wait() == 0
        said = (await proc.stderr.read()).decode()
        assert "stopped while starting" in said, said
        assert "Traceback" not in said, said
