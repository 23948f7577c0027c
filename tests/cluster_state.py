"""Fixtures for tests of the state gateway nodes share in the project's Redis Cluster
(127.0.0.1:7101-7106, ``scripts/cluster up``): each test has a namespace of its own,
whose keys are deleted after it. A test that needs the cluster fails, never skips,
when it cannot be had."""

from __future__ import annotations

import subprocess
import uuid
from collections.abc import AsyncIterator
from pathlib import Path

import pytest

from auth.cluster import Shared

ROOT = Path(__file__).resolve().parents[1]
URL = "redis://127.0.0.1:7101"
DEAD = "redis://127.0.0.1:7199"  # nothing listens there: a cluster that does not answer


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
    """A key prefix no other test uses; its keys are deleted after the test."""
    prefix = f"test-{uuid.uuid4().hex[:12]}:"
    yield prefix
    cleaner = Shared.open(redis_cluster, prefix)
    try:
        async for key in cleaner.redis.scan_iter(match=prefix + "*"):
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
    state = Shared.open(DEAD, "dead:")
    yield state
    await state.close()
